! Every Fortran entry point the shim wraps, called once or more from `use mpi`, each call written
! down as in basic.f90 ("call COMM OP BYTES" per rank in OUT_DIR/rank-R.txt) so the test can
! check the trace holds exactly these calls: blocking and nonblocking collectives, every send
! mode, receives, send-receives, persistent requests, every completion call, and every
! communicator constructor. Integers are 4 bytes. Usage: coverage OUT_DIR (exactly 4 ranks).
program coverage
  use mpi
  implicit none
  integer, parameter :: N = 4
  integer :: ierr, me, np, i, r, req, reqs(8), idx, cnt
  logical :: flag
  integer :: a(N), b(N), c(N * N), counts(N), displs(N), types(N)
  integer :: sc(N), sd(N), rcv(N), rd(N)
  integer :: status(MPI_STATUS_SIZE), statuses(MPI_STATUS_SIZE, 8), indices(8)
  integer :: split, stype, dup, dupi, idup, created, group, wgroup, cgroup, cart, sub, graph
  integer :: dist, adj, inter, merged
  integer :: ranks(2), dims(2), nodes_index(N), edges(2 * N), src(1), dst(1), deg(1)
  logical :: periods(2), remain(2)
  integer :: bbuf(64), bsize
  character(len=256) :: dir
  character(len=16) :: rs
  character(len=*), parameter :: W = 'MPI_COMM_WORLD'

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, me, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, np, ierr)
  if (np /= N) stop 'run with exactly 4 ranks'
  call get_command_argument(1, dir)
  write (rs, '(I0)') me
  open (unit=10, file=trim(dir)//'/rank-'//trim(rs)//'.txt', status='replace')
  a = me
  do i = 1, N
    counts(i) = i
    displs(i) = (i - 1) * N
    types(i) = MPI_INTEGER
  end do

  ! ----- blocking collectives
  call MPI_BARRIER(MPI_COMM_WORLD, ierr);                                 call expect(W, 'barrier', 0)
  call MPI_BCAST(a, 2, MPI_INTEGER, 1, MPI_COMM_WORLD, ierr);             call expect(W, 'broadcast', 8)
  call MPI_REDUCE(a, b, N, MPI_INTEGER, MPI_SUM, 2, MPI_COMM_WORLD, ierr); call expect(W, 'reduce', 16)
  call MPI_ALLREDUCE(a, b, N, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr); call expect(W, 'allreduce', 16)
  call MPI_SCAN(a, b, 3, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr);     call expect(W, 'scan', 12)
  call MPI_EXSCAN(a, b, 3, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr);   call expect(W, 'exscan', 12)
  call MPI_ALLGATHER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call expect(W, 'allgather', 16)
  call MPI_ALLTOALL(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call expect(W, 'alltoall', 16)
  call MPI_ALLGATHERV(a, me + 1, MPI_INTEGER, c, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call expect(W, 'allgatherv', 40)
  call MPI_GATHER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  call expect(W, 'gather', 16)
  call MPI_SCATTER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, 3, MPI_COMM_WORLD, ierr)
  call expect(W, 'scatter', 16)
  call MPI_GATHERV(a, me + 1, MPI_INTEGER, c, counts, displs, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  if (me == 0) then
    call expect(W, 'gatherv', 40)
  else
    call expect(W, 'gatherv', 4 * (me + 1))
  end if
  call MPI_SCATTERV(c, counts, displs, MPI_INTEGER, b, me + 1, MPI_INTEGER, 1, MPI_COMM_WORLD, ierr)
  if (me == 1) then
    call expect(W, 'scatterv', 40)
  else
    call expect(W, 'scatterv', 4 * (me + 1))
  end if
  call MPI_REDUCE_SCATTER(c, b, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call expect(W, 'reducescatter', 40)
  call MPI_REDUCE_SCATTER_BLOCK(c, b, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call expect(W, 'reducescatter', 16)
  do i = 1, N
    sc(i) = 1
    sd(i) = i - 1
    rcv(i) = 1
    rd(i) = i - 1
  end do
  call MPI_ALLTOALLV(a, sc, sd, MPI_INTEGER, b, rcv, rd, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call expect(W, 'alltoallv', 16)
  do i = 1, N
    sd(i) = 4 * (i - 1)
  end do
  call MPI_ALLTOALLW(a, sc, sd, types, b, rcv, sd, types, MPI_COMM_WORLD, ierr)
  call expect(W, 'alltoallw', 16)

  ! ----- nonblocking collectives, completed by each completion call in turn
  call MPI_IBARRIER(MPI_COMM_WORLD, req, ierr);                           call expect(W, 'barrier', 0)
  call MPI_WAIT(req, status, ierr)
  call MPI_IBCAST(a, 2, MPI_INTEGER, 0, MPI_COMM_WORLD, req, ierr);       call expect(W, 'broadcast', 8)
  flag = .false.
  do while (.not. flag)
    call MPI_TEST(req, flag, MPI_STATUS_IGNORE, ierr)
  end do
  call MPI_IREDUCE(a, b, N, MPI_INTEGER, MPI_SUM, 1, MPI_COMM_WORLD, reqs(1), ierr)
  call expect(W, 'reduce', 16)
  call MPI_IALLREDUCE(a, c, N, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'allreduce', 16)
  call MPI_WAITALL(2, reqs, statuses, ierr)
  call MPI_ISCAN(a, b, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
  call expect(W, 'scan', 8)
  call MPI_IEXSCAN(a, c, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'exscan', 8)
  flag = .false.
  do while (.not. flag)
    call MPI_TESTALL(2, reqs, flag, MPI_STATUSES_IGNORE, ierr)
  end do
  call MPI_IALLGATHER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, MPI_COMM_WORLD, reqs(1), ierr)
  call expect(W, 'allgather', 16)
  call MPI_IALLTOALL(a, 1, MPI_INTEGER, c, 1, MPI_INTEGER, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'alltoall', 16)
  do i = 1, 2
    call MPI_WAITANY(2, reqs, idx, status, ierr)
  end do
  call MPI_IALLGATHERV(a, me + 1, MPI_INTEGER, c, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, &
                       reqs(1), ierr)
  call expect(W, 'allgatherv', 40)
  call MPI_IGATHER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, 2, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'gather', 16)
  cnt = 0
  do while (cnt < 2)
    call MPI_TESTANY(2, reqs, idx, flag, MPI_STATUS_IGNORE, ierr)
    if (flag .and. idx /= MPI_UNDEFINED) cnt = cnt + 1
  end do
  call MPI_ISCATTER(a, 1, MPI_INTEGER, b, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, reqs(1), ierr)
  call expect(W, 'scatter', 16)
  call MPI_IGATHERV(a, me + 1, MPI_INTEGER, c, counts, displs, MPI_INTEGER, 3, MPI_COMM_WORLD, &
                    reqs(2), ierr)
  if (me == 3) then
    call expect(W, 'gatherv', 40)
  else
    call expect(W, 'gatherv', 4 * (me + 1))
  end if
  cnt = 0
  do while (cnt < 2)
    call MPI_WAITSOME(2, reqs, r, indices, statuses, ierr)
    if (r /= MPI_UNDEFINED) cnt = cnt + r
  end do
  call MPI_ISCATTERV(c, counts, displs, MPI_INTEGER, b, me + 1, MPI_INTEGER, 0, MPI_COMM_WORLD, &
                     reqs(1), ierr)
  if (me == 0) then
    call expect(W, 'scatterv', 40)
  else
    call expect(W, 'scatterv', 4 * (me + 1))
  end if
  call MPI_IREDUCE_SCATTER(c, b, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'reducescatter', 40)
  cnt = 0
  do while (cnt < 2)
    call MPI_TESTSOME(2, reqs, r, indices, MPI_STATUSES_IGNORE, ierr)
    if (r /= MPI_UNDEFINED) cnt = cnt + r
  end do
  call MPI_IREDUCE_SCATTER_BLOCK(c, b, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
  call expect(W, 'reducescatter', 16)
  do i = 1, N
    sd(i) = i - 1
  end do
  call MPI_IALLTOALLV(a, sc, sd, MPI_INTEGER, b, rcv, rd, MPI_INTEGER, MPI_COMM_WORLD, reqs(2), ierr)
  call expect(W, 'alltoallv', 16)
  do i = 1, N
    sd(i) = 4 * (i - 1)
  end do
  call MPI_IALLTOALLW(a, sc, sd, types, c, rcv, sd, types, MPI_COMM_WORLD, reqs(3), ierr)
  call expect(W, 'alltoallw', 16)
  call MPI_WAITALL(3, reqs, MPI_STATUSES_IGNORE, ierr)

  ! ----- point-to-point in pairs (0-1, 2-3): every send mode, receives, send-receives
  r = ieor(me, 1)
  call MPI_BUFFER_ATTACH(bbuf, 256, ierr)
  if (mod(me, 2) == 0) then
    call MPI_SEND(a, 3, MPI_INTEGER, r, 1, MPI_COMM_WORLD, ierr);  call expect(W, 'send', 12)
    call MPI_SSEND(a, 2, MPI_INTEGER, r, 2, MPI_COMM_WORLD, ierr); call expect(W, 'send', 8)
    call MPI_BSEND(a, 1, MPI_INTEGER, r, 3, MPI_COMM_WORLD, ierr); call expect(W, 'send', 4)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_RSEND(a, 4, MPI_INTEGER, r, 4, MPI_COMM_WORLD, ierr); call expect(W, 'send', 16)
    call MPI_ISSEND(a, 2, MPI_INTEGER, r, 5, MPI_COMM_WORLD, req, ierr)
    call expect(W, 'send', 8)
    call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
    call MPI_IBSEND(a, 1, MPI_INTEGER, r, 16, MPI_COMM_WORLD, req, ierr)
    call expect(W, 'send', 4)
    call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_IRSEND(a, 3, MPI_INTEGER, r, 17, MPI_COMM_WORLD, req, ierr)
    call expect(W, 'send', 12)
    call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
  else
    call MPI_RECV(b, 4, MPI_INTEGER, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, status, ierr)
    call expect(W, 'recv', 12)
    call MPI_RECV(b, 4, MPI_INTEGER, r, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
    call expect(W, 'recv', 8)
    call MPI_IRECV(c, 4, MPI_INTEGER, r, 4, MPI_COMM_WORLD, req, ierr)
    call MPI_RECV(b, 4, MPI_INTEGER, r, 3, MPI_COMM_WORLD, status, ierr)
    call expect(W, 'recv', 4)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_WAIT(req, status, ierr)
    call expect(W, 'recv', 16)
    call MPI_RECV(b, 4, MPI_INTEGER, r, 5, MPI_COMM_WORLD, status, ierr)
    call expect(W, 'recv', 8)
    call MPI_RECV(b, 4, MPI_INTEGER, r, 16, MPI_COMM_WORLD, status, ierr)
    call expect(W, 'recv', 4)
    call MPI_IRECV(c, 4, MPI_INTEGER, r, 17, MPI_COMM_WORLD, req, ierr)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_WAIT(req, status, ierr)
    call expect(W, 'recv', 12)
  end if
  call MPI_BUFFER_DETACH(bbuf, bsize, ierr)
  call MPI_SENDRECV(a, 2, MPI_INTEGER, r, 6, b, 2, MPI_INTEGER, r, 6, MPI_COMM_WORLD, status, ierr)
  call expect(W, 'sendrecv', 8)
  b = me
  call MPI_SENDRECV_REPLACE(b, 3, MPI_INTEGER, r, 7, r, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
  call expect(W, 'sendrecv', 12)

  ! ----- persistent requests: created once, started twice
  if (mod(me, 2) == 0) then
    call MPI_SEND_INIT(a, 1, MPI_INTEGER, r, 8, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_SSEND_INIT(a, 2, MPI_INTEGER, r, 9, MPI_COMM_WORLD, reqs(2), ierr)
    call MPI_BSEND_INIT(a, 1, MPI_INTEGER, r, 10, MPI_COMM_WORLD, reqs(3), ierr)
    call MPI_BUFFER_ATTACH(bbuf, 256, ierr)
    do i = 1, 2
      call MPI_START(reqs(1), ierr)
      call MPI_STARTALL(2, reqs(2:3), ierr)
      call MPI_WAITALL(3, reqs, MPI_STATUSES_IGNORE, ierr)
      call expect(W, 'send', 4)
      call expect(W, 'send', 8)
      call expect(W, 'send', 4)
    end do
    call MPI_BUFFER_DETACH(bbuf, bsize, ierr)
    call MPI_RSEND_INIT(a, 1, MPI_INTEGER, r, 11, MPI_COMM_WORLD, reqs(4), ierr)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_START(reqs(4), ierr)
    call MPI_WAIT(reqs(4), MPI_STATUS_IGNORE, ierr)
    call expect(W, 'send', 4)
    do i = 1, 4
      call MPI_REQUEST_FREE(reqs(i), ierr)
    end do
  else
    call MPI_RECV_INIT(b, 2, MPI_INTEGER, r, MPI_ANY_TAG, MPI_COMM_WORLD, reqs(1), ierr)
    do i = 1, 6
      call MPI_START(reqs(1), ierr)
      call MPI_WAIT(reqs(1), status, ierr)
    end do
    call expect(W, 'recv', 4)
    call expect(W, 'recv', 8)
    call expect(W, 'recv', 4)
    call expect(W, 'recv', 4)
    call expect(W, 'recv', 8)
    call expect(W, 'recv', 4)
    call MPI_IRECV(b, 1, MPI_INTEGER, r, 11, MPI_COMM_WORLD, req, ierr)
    call MPI_BARRIER(MPI_COMM_WORLD, ierr);                         call expect(W, 'barrier', 0)
    call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
    call expect(W, 'recv', 4)
    call MPI_REQUEST_FREE(reqs(1), ierr)
  end if

  ! ----- communicator constructors, each used once
  call MPI_COMM_SPLIT(MPI_COMM_WORLD, mod(me, 2), me, split, ierr)
  call MPI_COMM_SET_NAME(split, 'split', ierr)
  call MPI_ALLREDUCE(a, b, 1, MPI_INTEGER, MPI_SUM, split, ierr);   call expect('split', 'allreduce', 4)
  call MPI_COMM_SPLIT_TYPE(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, stype, ierr)
  call MPI_COMM_SET_NAME(stype, 'shared', ierr)
  call MPI_BARRIER(stype, ierr);                                    call expect('shared', 'barrier', 0)
  call MPI_COMM_DUP(split, dup, ierr)
  call MPI_COMM_SET_NAME(dup, 'dup', ierr)
  call MPI_BARRIER(dup, ierr);                                      call expect('dup', 'barrier', 0)
  call MPI_COMM_DUP_WITH_INFO(MPI_COMM_WORLD, MPI_INFO_NULL, dupi, ierr)
  call MPI_COMM_SET_NAME(dupi, 'dup-info', ierr)
  call MPI_BARRIER(dupi, ierr);                                     call expect('dup-info', 'barrier', 0)
  call MPI_COMM_IDUP(MPI_COMM_WORLD, idup, req, ierr)
  call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
  call MPI_COMM_SET_NAME(idup, 'idup', ierr)
  call MPI_BARRIER(idup, ierr);                                     call expect('idup', 'barrier', 0)
  call MPI_COMM_GROUP(MPI_COMM_WORLD, wgroup, ierr)
  ranks = (/ 0, 2 /)
  call MPI_GROUP_INCL(wgroup, 2, ranks, group, ierr)
  call MPI_COMM_CREATE(MPI_COMM_WORLD, group, created, ierr)
  if (created /= MPI_COMM_NULL) then
    call MPI_COMM_SET_NAME(created, 'created', ierr)
    call MPI_BARRIER(created, ierr);                                call expect('created', 'barrier', 0)
    call MPI_COMM_FREE(created, ierr)
  end if
  if (mod(me, 2) == 0) then
    call MPI_COMM_CREATE_GROUP(MPI_COMM_WORLD, group, 3, cgroup, ierr)
    call MPI_COMM_SET_NAME(cgroup, 'from-group', ierr)
    call MPI_BARRIER(cgroup, ierr);                                 call expect('from-group', 'barrier', 0)
    call MPI_COMM_FREE(cgroup, ierr)
  end if
  dims = (/ 2, 2 /)
  periods = (/ .true., .false. /)
  call MPI_CART_CREATE(MPI_COMM_WORLD, 2, dims, periods, .false., cart, ierr)
  call MPI_COMM_SET_NAME(cart, 'cart', ierr)
  call MPI_BARRIER(cart, ierr);                                     call expect('cart', 'barrier', 0)
  remain = (/ .true., .false. /)
  call MPI_CART_SUB(cart, remain, sub, ierr)
  call MPI_COMM_SET_NAME(sub, 'cart-sub', ierr)
  call MPI_BARRIER(sub, ierr);                                      call expect('cart-sub', 'barrier', 0)
  do i = 1, N
    nodes_index(i) = 2 * i
    edges(2 * i - 1) = mod(i, N)
    edges(2 * i) = mod(i + N - 2, N)
  end do
  call MPI_GRAPH_CREATE(MPI_COMM_WORLD, N, nodes_index, edges, .false., graph, ierr)
  call MPI_COMM_SET_NAME(graph, 'graph', ierr)
  call MPI_BARRIER(graph, ierr);                                    call expect('graph', 'barrier', 0)
  src(1) = me
  deg(1) = 1
  dst(1) = mod(me + 1, N)
  call MPI_DIST_GRAPH_CREATE(MPI_COMM_WORLD, 1, src, deg, dst, MPI_UNWEIGHTED, MPI_INFO_NULL, &
                             .false., dist, ierr)
  call MPI_COMM_SET_NAME(dist, 'dist', ierr)
  call MPI_BARRIER(dist, ierr);                                     call expect('dist', 'barrier', 0)
  src(1) = mod(me + N - 1, N)
  call MPI_DIST_GRAPH_CREATE_ADJACENT(MPI_COMM_WORLD, 1, src, MPI_UNWEIGHTED, 1, dst, &
                                      MPI_UNWEIGHTED, MPI_INFO_NULL, .false., adj, ierr)
  call MPI_COMM_SET_NAME(adj, 'adjacent', ierr)
  call MPI_BARRIER(adj, ierr);                                      call expect('adjacent', 'barrier', 0)
  call MPI_INTERCOMM_CREATE(split, 0, MPI_COMM_WORLD, 1 - mod(me, 2), 12, inter, ierr)
  call MPI_COMM_SET_NAME(inter, 'inter', ierr)
  call MPI_BARRIER(inter, ierr);                                    call expect('inter', 'barrier', 0)
  call MPI_INTERCOMM_MERGE(inter, mod(me, 2) == 1, merged, ierr)
  call MPI_COMM_SET_NAME(merged, 'merged', ierr)
  call MPI_BARRIER(merged, ierr);                                   call expect('merged', 'barrier', 0)
  call MPI_COMM_DISCONNECT(merged, ierr)
  call MPI_COMM_FREE(inter, ierr)
  call MPI_COMM_FREE(adj, ierr)
  call MPI_COMM_FREE(dist, ierr)
  call MPI_COMM_FREE(graph, ierr)
  call MPI_COMM_FREE(sub, ierr)
  call MPI_COMM_FREE(cart, ierr)
  call MPI_GROUP_FREE(group, ierr)
  call MPI_GROUP_FREE(wgroup, ierr)
  call MPI_COMM_FREE(idup, ierr)
  call MPI_COMM_FREE(dupi, ierr)
  call MPI_COMM_FREE(dup, ierr)
  call MPI_COMM_FREE(stype, ierr)
  call MPI_COMM_FREE(split, ierr)

  close (10)
  if (me == 0) print '(A)', 'coverage done'
  call MPI_FINALIZE(ierr)

contains

  subroutine expect(comm, op, bytes)
    character(len=*), intent(in) :: comm, op
    integer, intent(in) :: bytes
    write (10, '(A,1X,A,1X,A,1X,I0)') 'call', comm, op, bytes
  end subroutine expect
end program coverage
