! The `use mpi_f08` bindings: derived-type handles, no ierror, a nonblocking broadcast on a
! split communicator and a persistent send/receive pair started twice. Every call it makes is
! written down as in basic.f90. Usage: f08 OUT_DIR (an even number of ranks).
program f08
  use mpi_f08
  implicit none
  integer :: rank, nranks, i, peer
  type(MPI_Comm) :: pairs
  type(MPI_Request) :: r, p(2)
  double precision :: a(8), b(8)
  character(len=256) :: dir
  character(len=16) :: rs

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  call get_command_argument(1, dir)
  write (rs, '(I0)') rank
  open (unit=10, file=trim(dir)//'/rank-'//trim(rs)//'.txt', status='replace')
  a = rank
  call MPI_Allreduce(a, b, 8, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  call expect('MPI_COMM_WORLD', 'allreduce', 64)
  call MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, pairs)
  call MPI_Comm_set_name(pairs, 'pair')
  call MPI_Ibcast(b, 8, MPI_DOUBLE_PRECISION, 0, pairs, r)
  call MPI_Wait(r, MPI_STATUS_IGNORE)
  call expect('pair', 'broadcast', 64)
  peer = ieor(rank, 1)
  call MPI_Send_init(a, 8, MPI_DOUBLE_PRECISION, peer, 3, MPI_COMM_WORLD, p(1))
  call MPI_Recv_init(b, 8, MPI_DOUBLE_PRECISION, peer, 3, MPI_COMM_WORLD, p(2))
  do i = 1, 2
    call MPI_Startall(2, p)
    call MPI_Waitall(2, p, MPI_STATUSES_IGNORE)
    call expect('MPI_COMM_WORLD', 'send', 64)
    call expect('MPI_COMM_WORLD', 'recv', 64)
  end do
  call MPI_Request_free(p(1))
  call MPI_Request_free(p(2))
  call MPI_Comm_free(pairs)
  close (10)
  if (rank == 0) print '(A,F8.1)', 'sum ', b(1)
  call MPI_Finalize()

contains

  subroutine expect(comm, op, bytes)
    character(len=*), intent(in) :: comm, op
    integer, intent(in) :: bytes
    write (10, '(A,1X,A,1X,A,1X,I0)') 'call', comm, op, bytes
  end subroutine expect
end program f08
