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
    reader
        .submit(ReadRequest {
            file,
            offset: 3,
            len: 4,
            class: 0,
            tag: 1,
        })
        .unwrap();
    assert_eq!(
        &reader.completions().recv().unwrap().result.unwrap()[..],
        b"3456"
    );

    // An explicit backend wins over the environment.
    if let Ok(uring) = Reader::builder().backend(Backend::Uring).build() {
        assert_eq!(uring.backend().active, ActiveBackend::Uring);
    }
}
