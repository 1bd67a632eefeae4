! A Fortran MPI program (`use mpi`) for `paramedic trace`'s test of the Fortran bindings: each step every
! rank passes a buffer to its right neighbour with MPI_Sendrecv, then a smaller one with MPI_Irecv,
! MPI_Isend and MPI_Waitall; an MPI_Allreduce every 10 steps; then an MPI_Bcast, one MPI_Send from rank 0
! to rank 1 received with MPI_STATUS_IGNORE, and an MPI_Barrier. Usage: mpiexec -n N ring STEPS
program ring
  use mpi
  implicit none
  integer :: ierr, rank, nranks, step, steps, left, right
  integer :: req(2), stat(MPI_STATUS_SIZE), stats(MPI_STATUS_SIZE, 2)
  double precision :: sbuf(100), rbuf(100), total
  character(len=16) :: arg

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  steps = 50
  if (command_argument_count() >= 1) then
    call get_command_argument(1, arg)
    read (arg, *) steps
  end if
  right = mod(rank + 1, nranks)
  left = mod(rank - 1 + nranks, nranks)
  sbuf = rank
  total = 0
  do step = 1, steps
    call MPI_Sendrecv(sbuf, 100, MPI_DOUBLE_PRECISION, right, step, rbuf, 100, MPI_DOUBLE_PRECISION, &
                      left, step, MPI_COMM_WORLD, stat, ierr)
    call MPI_Irecv(rbuf, 10, MPI_DOUBLE_PRECISION, left, 1000 + step, MPI_COMM_WORLD, req(1), ierr)
    call MPI_Isend(sbuf, 10, MPI_DOUBLE_PRECISION, right, 1000 + step, MPI_COMM_WORLD, req(2), ierr)
    call MPI_Waitall(2, req, stats, ierr)
    if (mod(step, 10) == 0) then
      call MPI_Allreduce(rbuf(1), total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    end if
  end do
  call MPI_Bcast(total, 1, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    call MPI_Send(total, 1, MPI_DOUBLE_PRECISION, 1, 7, MPI_COMM_WORLD, ierr)
  else if (rank == 1) then
    call MPI_Recv(total, 1, MPI_DOUBLE_PRECISION, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
  end if
  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  call MPI_Finalize(ierr)
end program ring
