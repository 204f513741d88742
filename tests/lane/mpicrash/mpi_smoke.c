/* mpi-c-smoke: reft-mpi-smoke's check in plain C (no Go runtime, no cgo):
 * every rank contributes rank+1 to an MPI_Allreduce and checks n(n+1)/2.
 * tests/lane/mpicrash/count runs it beside the Go program to tell an
 * Open MPI/PMIx start-up crash from one that needs Go's signal handling. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int rank, size;
	double in, out = 0;
	char host[256] = "?";
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	in = rank + 1;
	MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	gethostname(host, sizeof host - 1);
	if (out != size * (size + 1) / 2.0) {
		fprintf(stderr, "rank %d/%d on %s: allreduce sum %g, want %g\n", rank, size, host, out, size * (size + 1) / 2.0);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	printf("rank %d/%d host %s allreduce-sum %g ok\n", rank, size, host, out);
	MPI_Finalize();
	return 0;
}
