// Compiled as part of the loaders layer by layers_upward_include_fails: loaders/ may not include
// models/, so this file must not build (the test expects "No such file" for the header below).
#include "loaders/dataset.h"
#include "models/decoder.h"

int lt_layer_probe_upward() { return 0; }
