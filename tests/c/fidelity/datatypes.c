/* Derived datatypes, MPI_BOTTOM with absolute addresses, and zero counts, in collectives and
 * point-to-point. Needs an even number of ranks. */
#include "fidelity.h"

struct item {
    int id;
    double value;
};

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    fid_open(argc, argv);
    const char *W = "MPI_COMM_WORLD";
    int n = fid_size, me = fid_rank, peer = me ^ 1;
    double sum = 0;

    /* A strided vector: every other double of 8. */
    MPI_Datatype vec;
    CHECK(MPI_Type_vector(4, 1, 2, MPI_DOUBLE, &vec));
    CHECK(MPI_Type_commit(&vec));
    double v[8];
    for (int i = 0; i < 8; i++) v[i] = me == 1 ? 1.5 * i : -1;
    CHECK(MPI_Bcast(v, 1, vec, 1, MPI_COMM_WORLD));
    expect(W, "broadcast", 32);
    for (int i = 0; i < 8; i++) sum += v[i];

    /* A struct, sent and received between pairs. */
    MPI_Datatype st;
    int lens[2] = {1, 1};
    MPI_Aint offs[2] = {offsetof(struct item, id), offsetof(struct item, value)};
    MPI_Datatype types[2] = {MPI_INT, MPI_DOUBLE};
    CHECK(MPI_Type_create_struct(2, lens, offs, types, &st));
    MPI_Datatype item_t;
    CHECK(MPI_Type_create_resized(st, 0, sizeof(struct item), &item_t));
    CHECK(MPI_Type_commit(&item_t));
    int item_size;
    MPI_Type_size(item_t, &item_size);
    struct item out[3], in[3];
    for (int i = 0; i < 3; i++) {
        out[i].id = me * 10 + i;
        out[i].value = me + 0.25 * i;
    }
    CHECK(MPI_Sendrecv(out, 3, item_t, peer, 4, in, 3, item_t, peer, 4, MPI_COMM_WORLD,
                       MPI_STATUS_IGNORE));
    expect(W, "sendrecv", 3L * item_size);
    for (int i = 0; i < 3; i++) sum += in[i].id + in[i].value;

    /* A contiguous type of 3 ints in an all-to-all. */
    MPI_Datatype tri;
    CHECK(MPI_Type_contiguous(3, MPI_INT, &tri));
    CHECK(MPI_Type_commit(&tri));
    int *a = malloc(sizeof(int) * 3 * n), *b = malloc(sizeof(int) * 3 * n);
    for (int i = 0; i < 3 * n; i++) a[i] = me * 1000 + i;
    CHECK(MPI_Alltoall(a, 1, tri, b, 1, tri, MPI_COMM_WORLD));
    expect(W, "alltoall", 12L * n);
    for (int i = 0; i < 3 * n; i++) sum += b[i];

    /* MPI_BOTTOM: a type whose displacements are absolute addresses of two variables. */
    int x = me == 0 ? 42 : 0;
    double y = me == 0 ? 2.5 : 0;
    MPI_Aint ax, ay;
    MPI_Get_address(&x, &ax);
    MPI_Get_address(&y, &ay);
    MPI_Aint abs_offs[2] = {ax, ay};
    MPI_Datatype abs_t;
    CHECK(MPI_Type_create_struct(2, lens, abs_offs, types, &abs_t));
    CHECK(MPI_Type_commit(&abs_t));
    int abs_size;
    MPI_Type_size(abs_t, &abs_size);
    CHECK(MPI_Bcast(MPI_BOTTOM, 1, abs_t, 0, MPI_COMM_WORLD));
    expect(W, "broadcast", abs_size);
    sum += x + y;
    if (me % 2 == 0) {
        CHECK(MPI_Send(MPI_BOTTOM, 1, abs_t, peer, 5, MPI_COMM_WORLD));
        expect(W, "send", abs_size);
    } else {
        x = 0;
        y = 0;
        CHECK(MPI_Recv(MPI_BOTTOM, 1, abs_t, peer, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        expect(W, "recv", abs_size);
        sum += x + y;
    }

    /* Zero counts. */
    int z = 7;
    CHECK(MPI_Allreduce(MPI_IN_PLACE, &z, 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    expect(W, "allreduce", 0);
    CHECK(MPI_Bcast(&z, 0, MPI_INT, 0, MPI_COMM_WORLD));
    expect(W, "broadcast", 0);
    if (me % 2 == 0) {
        CHECK(MPI_Send(&z, 0, MPI_INT, peer, 6, MPI_COMM_WORLD));
        expect(W, "send", 0);
    } else {
        MPI_Status s;
        int got = -1;
        CHECK(MPI_Recv(&z, 4, MPI_INT, MPI_ANY_SOURCE, 6, MPI_COMM_WORLD, &s));
        MPI_Get_count(&s, MPI_INT, &got);
        expect(W, "recv", 0);
        sum += got + s.MPI_SOURCE;
    }
    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n), total = 0;
    for (int i = 0; i < n; i++) {
        counts[i] = i % 2; /* even ranks contribute nothing */
        displs[i] = total;
        total += counts[i];
    }
    int *gv = calloc(total + 1, sizeof(int));
    int mine = me + 100;
    CHECK(MPI_Allgatherv(&mine, counts[me], MPI_INT, gv, counts, displs, MPI_INT, MPI_COMM_WORLD));
    expect(W, "allgatherv", 4L * total);
    for (int i = 0; i < total; i++) sum += gv[i];

    MPI_Type_free(&vec);
    MPI_Type_free(&st);
    MPI_Type_free(&item_t);
    MPI_Type_free(&tri);
    MPI_Type_free(&abs_t);
    fid_report("datatype checksums", sum);
    fid_close();
    MPI_Finalize();
    return 0;
}
