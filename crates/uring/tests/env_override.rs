//! `LOBSTER_IO` overrides `Backend::Auto` (its own test binary: it sets the environment).

use lobster_uring::{ActiveBackend, Backend, OpenOptions, ReadRequest, Reader};

#[test]
fn lobster_io_pread_selects_the_pread_backend_for_auto_only() {
    std::env::set_var("LOBSTER_IO", "pread");
    let reader = Reader::builder().backend(Backend::Auto).build().unwrap();
    assert_eq!(reader.backend().active, ActiveBackend::Pread);
    assert!(
        reader.backend().reason.contains("LOBSTER_IO=pread"),
        "{:?}",
        reader.backend()
    );

    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("env-override");
    std::fs::write(&path, b"0123456789").unwrap();
    let file = reader.open(&path, OpenOptions::default()).unwrap();
    let mut session = reader.session().unwrap();
    session
        .submit(ReadRequest {
            file,
            offset: 3,
            len: 4,
            class: 0,
            tag: 1,
        })
        .unwrap();
    let mut done = Vec::new();
    session.wait(1, &mut done).unwrap();
    assert_eq!(&done.pop().unwrap().result.unwrap()[..], b"3456");

    // An explicit backend wins over the environment, wherever the kernel lets a ring be set up.
    if let Err(why) = probe_io_uring() {
        eprintln!("skipping the Backend::Uring check: io_uring_setup fails here: {why}");
        return;
    }
    let uring = Reader::builder()
        .backend(Backend::Uring)
        .build()
        .expect("io_uring_setup works, so Backend::Uring must build despite LOBSTER_IO=pread");
    assert_eq!(uring.backend().active, ActiveBackend::Uring);
}

/// Sets up (and closes) a ring with the raw system call, apart from the reader's own setup,
/// so that the reader failing where the kernel allows io_uring is not taken for a skip.
fn probe_io_uring() -> Result<(), std::io::Error> {
    // struct io_uring_params is 120 bytes; all zero asks for nothing special.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup writes at most sizeof(struct io_uring_params) = 120 bytes into
    // `params`, which is 120 bytes long and outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is the ring descriptor just returned, owned by nobody else.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}
