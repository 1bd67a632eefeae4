! The Fortran bindings of the calls clogtrace_fortran_more.h wraps (persistent requests, MPI_Gatherv,
! one-sided, MPI_Sendrecv_replace, MPI_Probe, a communicator's creation, MPI-IO), three rounds, and one it
! does not (MPI_Neighbor_allgather, named as untraced). Used by tests/integration/test_trace_bindings.py.
program fext
  use mpi
  implicit none
  integer :: rank, nranks, ierr, i, win, fh, left, right, newcomm, cart, dims(1)
  logical :: periods(1)
  integer :: reqs(2), counts(16), displs(16), st(MPI_STATUS_SIZE)
  integer(kind=MPI_ADDRESS_KIND) :: winsize, disp
  integer(kind=MPI_OFFSET_KIND) :: offset
  double precision :: a(4), b(4), g(64), w(64)
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  right = mod(rank + 1, nranks)
  left = mod(rank + nranks - 1, nranks)
  a = rank
  counts = 4
  do i = 1, 16
    displs(i) = 4 * (i - 1)
  end do
  call MPI_Send_init(a, 4, MPI_DOUBLE_PRECISION, right, 5, MPI_COMM_WORLD, reqs(1), ierr)
  call MPI_Recv_init(b, 4, MPI_DOUBLE_PRECISION, left, 5, MPI_COMM_WORLD, reqs(2), ierr)
  winsize = 64 * 8
  call MPI_Win_create(w, winsize, 8, MPI_INFO_NULL, MPI_COMM_WORLD, win, ierr)
  do i = 1, 3
    call MPI_Startall(2, reqs, ierr)
    call MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE, ierr)
    call MPI_Gatherv(a, 4, MPI_DOUBLE_PRECISION, g, counts, displs, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
    call MPI_Win_fence(0, win, ierr)
    disp = 4 * rank
    call MPI_Put(a, 4, MPI_DOUBLE_PRECISION, right, disp, 4, MPI_DOUBLE_PRECISION, win, ierr)
    call MPI_Win_fence(0, win, ierr)
    call MPI_Sendrecv_replace(a, 4, MPI_DOUBLE_PRECISION, right, 6, left, 6, MPI_COMM_WORLD, st, ierr)
    if (rank == 0) then
      call MPI_Send(a, 4, MPI_DOUBLE_PRECISION, 1, 7, MPI_COMM_WORLD, ierr)
    else if (rank == 1) then
      call MPI_Probe(0, 7, MPI_COMM_WORLD, st, ierr)
      call MPI_Recv(b, 4, MPI_DOUBLE_PRECISION, 0, 7, MPI_COMM_WORLD, st, ierr)
    end if
  end do
  call MPI_Win_free(win, ierr)
  call MPI_Request_free(reqs(1), ierr)
  call MPI_Request_free(reqs(2), ierr)
  call MPI_Comm_split(MPI_COMM_WORLD, 0, rank, newcomm, ierr)
  dims(1) = nranks
  periods(1) = .true.
  call MPI_Cart_create(newcomm, 1, dims, periods, .false., cart, ierr)
  call MPI_Neighbor_allgather(a, 1, MPI_DOUBLE_PRECISION, b, 1, MPI_DOUBLE_PRECISION, cart, ierr)
  call MPI_File_open(MPI_COMM_WORLD, 'fext.dat', MPI_MODE_CREATE + MPI_MODE_WRONLY, MPI_INFO_NULL, fh, ierr)
  offset = rank * 32
  call MPI_File_write_at_all(fh, offset, a, 4, MPI_DOUBLE_PRECISION, MPI_STATUS_IGNORE, ierr)
  call MPI_File_close(fh, ierr)
  call MPI_Finalize(ierr)
end program fext
