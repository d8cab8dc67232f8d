// Compiled as part of the loaders layer by layers_downward_include_builds: headers of the layer
// itself and of the layers below it are found, so the upward probe fails only for its include.
#include "engine/tensor.h"
#include "kernels/linear.h"
#include "loaders/dataset.h"

int lt_layer_probe_downward() { return 0; }
