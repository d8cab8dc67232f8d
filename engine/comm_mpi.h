// The MPI backend's entry points, private to engine/comm*.cpp. Without MPI in the build these
// report "not available" and the factory refuses --comm_backend mpi in one line.
#pragma once

#include <memory>

#include "engine/comm.h"

namespace leantune::comm_detail {

bool mpi_available();
// Initialises MPI (once) and returns the world communicator over MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_world(const CommOptions& options);
// A communicator over a duplicate (MPI_Comm_dup) of the caller's MPI_Comm, given as its Fortran
// handle (MPI_Comm_c2f); MPI must be initialised.
std::unique_ptr<Communicator> make_mpi_from_handle(int64_t fortran_handle,
                                                   const CommOptions& options);
// MPI_Abort on MPI_COMM_WORLD when MPI is initialised and not finalised; returns otherwise.
void mpi_abort_if_initialized(int exit_code);
void mpi_finalize_if_initialized();

}  // namespace leantune::comm_detail
