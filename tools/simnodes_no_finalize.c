/* Preloaded into the ranks by tools/simnodes.sh --no-finalize: MPI_Finalize
 * returns at once and MPI stays initialized until the process exits, so a
 * job cannot hang there (MPICH 4.0.2 with UCX 1.13 over TCP does in some
 * runs across nodes: docs/testing.md, "Across simulated nodes"). Through
 * MPI's profiling interface: it defines MPI_Finalize, libmpich's weak one
 * is not called. */
int MPI_Finalize(void) { return 0; }
