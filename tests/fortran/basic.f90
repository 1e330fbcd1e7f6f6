! Fortran (`use mpi`) the way a Fortran code calls MPI: collectives with MPI_IN_PLACE, split and
! dup communicators with names, a nonblocking all-reduce, a ring exchange with a wildcard receive
! completed by MPI_WAITALL, and a send-receive. Every call it makes is written down, one line per
! call ("call COMM OP BYTES", per rank, in OUT_DIR/rank-R.txt), and the test compares the trace
! with those lines. Usage: basic OUT_DIR (any number of ranks >= 2).
program basic
  use mpi
  implicit none
  integer :: ierr, rank, nranks, split, dup, i, req(2), r1, peer, src
  integer :: status(MPI_STATUS_SIZE)
  double precision :: a(16), b(16)
  integer :: n(4)
  character(len=256) :: dir
  character(len=16) :: rs

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, dir)
  write (rs, '(I0)') rank
  open (unit=10, file=trim(dir)//'/rank-'//trim(rs)//'.txt', status='replace')
  a = rank
  n = 0

  do i = 1, 2
    call MPI_ALLREDUCE(a, b, 16, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call expect('MPI_COMM_WORLD', 'allreduce', 128)
  end do
  call MPI_ALLREDUCE(MPI_IN_PLACE, a, 16, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call expect('MPI_COMM_WORLD', 'allreduce', 128)
  call MPI_BCAST(n, 4, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  call expect('MPI_COMM_WORLD', 'broadcast', 16)
  call MPI_BCAST(b, 16, MPI_DOUBLE_PRECISION, nranks - 1, MPI_COMM_WORLD, ierr)
  call expect('MPI_COMM_WORLD', 'broadcast', 128)
  call MPI_BARRIER(MPI_COMM_WORLD, ierr)
  call expect('MPI_COMM_WORLD', 'barrier', 0)

  ! Even and odd ranks; a duplicate of each; one all-gather of one integer on each.
  call MPI_COMM_SPLIT(MPI_COMM_WORLD, mod(rank, 2), rank, split, ierr)
  call MPI_COMM_SET_NAME(split, 'parity   ', ierr)
  call MPI_COMM_DUP(split, dup, ierr)
  call MPI_COMM_SET_NAME(dup, 'parity-dup', ierr)
  call MPI_ALLGATHER(rank, 1, MPI_INTEGER, n, 1, MPI_INTEGER, split, ierr)
  call expect('parity', 'allgather', 4 * ((nranks + 1 - mod(rank, 2)) / 2))
  call MPI_ALLGATHER(rank, 1, MPI_INTEGER, n, 1, MPI_INTEGER, dup, ierr)
  call expect('parity-dup', 'allgather', 4 * ((nranks + 1 - mod(rank, 2)) / 2))

  call MPI_IALLREDUCE(a, b, 16, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, r1, ierr)
  call MPI_WAIT(r1, MPI_STATUS_IGNORE, ierr)
  call expect('MPI_COMM_WORLD', 'allreduce', 128)

  peer = mod(rank + 1, nranks)
  src = mod(rank + nranks - 1, nranks)
  call MPI_IRECV(b, 16, MPI_DOUBLE_PRECISION, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, req(1), ierr)
  call MPI_ISEND(a, 16, MPI_DOUBLE_PRECISION, peer, 7, MPI_COMM_WORLD, req(2), ierr)
  call MPI_WAITALL(2, req, MPI_STATUSES_IGNORE, ierr)
  call expect('MPI_COMM_WORLD', 'recv', 128)
  call expect('MPI_COMM_WORLD', 'send', 128)
  call MPI_SENDRECV(a, 4, MPI_DOUBLE_PRECISION, peer, 8, b, 4, MPI_DOUBLE_PRECISION, &
                    src, 8, MPI_COMM_WORLD, status, ierr)
  call expect('MPI_COMM_WORLD', 'sendrecv', 32)
  if (status(MPI_SOURCE) /= src) stop 'wrong source'

  call MPI_COMM_FREE(dup, ierr)
  call MPI_COMM_FREE(split, ierr)
  close (10)
  if (rank == 0) print '(A,F8.1)', 'sum ', a(1)
  call MPI_FINALIZE(ierr)

contains

  subroutine expect(comm, op, bytes)
    character(len=*), intent(in) :: comm, op
    integer, intent(in) :: bytes
    write (10, '(A,1X,A,1X,A,1X,I0)') 'call', comm, op, bytes
  end subroutine expect
end program basic
