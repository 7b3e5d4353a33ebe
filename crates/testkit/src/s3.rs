//! A real S3 server for tests: s3s-fs over a temporary directory on a loopback port, with
//! faults switched on at run time.
//!
//! The server runs on a thread and tokio runtime of its own; [`TestS3`]'s `Drop` stops it and
//! joins the thread (connections still open, stalled ones too, are dropped with it). Objects
//! are uploaded by HTTP PUT through [`TestS3::put`], so that s3s-fs stores their ETag: a file
//! copied in has its MD5 computed over the whole file on every GET and HEAD.
//!
//! Where s3s-fs 0.14 differs from S3: it ignores `If-Match` on GET, so the wrapper here
//! answers `412 PreconditionFailed` as S3 does; and its listings carry no ETag (S3's do).
//!
//! ```
//! use lobster_testkit::s3::TestS3;
//!
//! let s3 = TestS3::start();
//! s3.create_bucket("bkt");
//! s3.put("bkt", "train/a.bin", b"hello".to_vec());
//! assert!(s3.endpoint().starts_with("http://127.0.0.1:"));
//! assert!(s3.requests() >= 1);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::ObjectStoreExt;

/// The access key the server accepts.
pub const ACCESS_KEY: &str = "AKIDLOBSTERTEST";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "lobster-test-secret";

/// The answer of a 503 storm, as S3 words it.
const SLOW_DOWN: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
    <Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

/// The answer to a GET whose If-Match names another ETag.
const PRECONDITION_FAILED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
    <Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you \
    specified did not hold</Message></Error>";

/// Faults armed at run time, and the request count; shared with the server thread.
#[derive(Debug, Default)]
struct Faults {
    slow_down: AtomicU64,
    stall: AtomicU64,
    requests: AtomicU64,
}

/// Takes one from `counter` if it is above zero.
fn take_one(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// A handle on the server's faults and request count, for other threads.
#[derive(Clone, Debug)]
pub struct FaultSwitch(Arc<Faults>);

impl FaultSwitch {
    /// Answers the next `n` requests `503 SlowDown` (replacing any count still armed).
    pub fn slow_down_next(&self, n: u64) {
        self.0.slow_down.store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` successful object GETs send their head and first body chunk, then
    /// nothing more, ever (replacing any count still armed).
    pub fn stall_next(&self, n: u64) {
        self.0.stall.store(n, Ordering::SeqCst);
    }

    /// Requests the server has received, faulted ones included.
    pub fn requests(&self) -> u64 {
        self.0.requests.load(Ordering::SeqCst)
    }
}

/// Where the buckets live: a temporary directory removed with the server, or one the caller
/// keeps.
#[derive(Debug)]
enum Root {
    Temp(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

/// s3s-fs on `127.0.0.1:0`, with SigV4 credentials [`ACCESS_KEY`] / [`SECRET_KEY`].
pub struct TestS3 {
    addr: SocketAddr,
    root: Root,
    faults: FaultSwitch,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The uploading client's runtime and its clients per bucket: a client is used only on
    /// the runtime that opened its connections.
    uploader: Mutex<(tokio::runtime::Runtime, HashMap<String, AmazonS3>)>,
}

impl fmt::Debug for TestS3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestS3")
            .field("addr", &self.addr)
            .field("root", &self.root())
            .finish()
    }
}

impl TestS3 {
    /// Starts the server; panics if it cannot (a test helper).
    pub fn start() -> TestS3 {
        let root = tempfile::tempdir().expect("a temporary directory for the S3 server");
        Self::serve(Root::Temp(root), 0)
    }

    /// Starts the server over the buckets in `root` (kept when it stops), on `port` of
    /// 127.0.0.1 (0: a free one); panics if it cannot (a test and bench helper).
    pub fn start_in(root: &std::path::Path, port: u16) -> TestS3 {
        Self::serve(Root::Kept(root.to_path_buf()), port)
    }

    fn serve(root: Root, port: u16) -> TestS3 {
        let dir = match &root {
            Root::Temp(t) => t.path().to_path_buf(),
            Root::Kept(p) => p.clone(),
        };
        let fs = s3s_fs::FileSystem::new(&dir).expect("s3s-fs over the server's directory");
        let mut builder = s3s::service::S3ServiceBuilder::new(fs);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the listener's address");
        let faults = Arc::new(Faults::default());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = faults.clone();
        let thread = std::thread::Builder::new()
            .name("test-s3".to_string())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the S3 server's runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    let http = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    loop {
                        let socket = tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => match accepted {
                                Ok((socket, _)) => socket,
                                Err(_) => continue,
                            },
                        };
                        let (service, faults) = (service.clone(), shared.clone());
                        let svc = hyper::service::service_fn(move |req| {
                            faulty(service.clone(), faults.clone(), req)
                        });
                        let conn = http
                            .serve_connection(hyper_util::rt::TokioIo::new(socket), svc)
                            .into_owned();
                        tokio::spawn(async move {
                            let _ = conn.await;
                        });
                    }
                });
                // The runtime drops here, and with it every connection task.
            })
            .expect("the S3 server's thread");
        let uploader = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the uploader's runtime");
        TestS3 {
            addr,
            root,
            faults: FaultSwitch(faults),
            stop: Some(stop),
            thread: Some(thread),
            uploader: Mutex::new((uploader, HashMap::new())),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The access key the server accepts.
    pub fn access_key(&self) -> &'static str {
        ACCESS_KEY
    }

    /// The secret key the server accepts.
    pub fn secret_key(&self) -> &'static str {
        SECRET_KEY
    }

    /// The directory the buckets live in.
    pub fn root(&self) -> &std::path::Path {
        match &self.root {
            Root::Temp(t) => t.path(),
            Root::Kept(p) => p,
        }
    }

    /// Creates a bucket (s3s-fs keeps one as a directory).
    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir_all(self.root().join(name)).expect("the bucket's directory");
    }

    /// Uploads `bytes` as `key` by HTTP PUT; returns the ETag the server stored. The PUT
    /// passes through the faults and counts as a request.
    pub fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> String {
        let mut guard = self.uploader.lock().unwrap_or_else(|e| e.into_inner());
        let (rt, clients) = &mut *guard;
        let client = clients.entry(bucket.to_string()).or_insert_with(|| {
            AmazonS3Builder::new()
                .with_endpoint(self.endpoint())
                .with_allow_http(true)
                .with_region("us-east-1")
                .with_bucket_name(bucket)
                .with_access_key_id(ACCESS_KEY)
                .with_secret_access_key(SECRET_KEY)
                .build()
                .expect("the uploading client")
        });
        let put = rt.block_on(client.put(&Path::from(key), bytes.into()));
        let put = put.unwrap_or_else(|e| panic!("PUT s3://{bucket}/{key}: {e}"));
        put.e_tag
            .unwrap_or_else(|| panic!("PUT s3://{bucket}/{key}: no ETag"))
    }

    /// A handle on the faults and the request count, for other threads.
    pub fn faults(&self) -> FaultSwitch {
        self.faults.clone()
    }

    /// Answers the next `n` requests `503 SlowDown`.
    pub fn slow_down_next(&self, n: u64) {
        self.faults.slow_down_next(n);
    }

    /// Makes the next `n` successful object GETs stall after their first body chunk.
    pub fn stall_next(&self, n: u64) {
        self.faults.stall_next(n);
    }

    /// Requests the server has received.
    pub fn requests(&self) -> u64 {
        self.faults.requests()
    }
}

impl Drop for TestS3 {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The S3 service behind the faults.
async fn faulty(
    service: s3s::service::S3Service,
    faults: Arc<Faults>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<s3s::Body>, s3s::HttpError> {
    faults.requests.fetch_add(1, Ordering::SeqCst);
    if take_one(&faults.slow_down) {
        return Ok(http::Response::builder()
            .status(503)
            .header("content-type", "application/xml")
            .body(s3s::Body::from(SLOW_DOWN.to_string()))
            .expect("a 503 response"));
    }
    // An object GET: /bucket/key, not a listing (/bucket?list-type=2).
    let object_get =
        req.method() == http::Method::GET && req.uri().path().trim_start_matches('/').contains('/');
    let if_match = req.headers().get(http::header::IF_MATCH).cloned();
    let resp = hyper::service::Service::call(&service, req).await?;
    // s3s-fs 0.14 ignores If-Match on GET; S3 answers 412 when the ETag differs.
    if let Some(wanted) = if_match.filter(|_| object_get && resp.status().is_success()) {
        let etag = resp.headers().get(http::header::ETAG);
        if wanted != "*" && etag != Some(&wanted) {
            return Ok(http::Response::builder()
                .status(412)
                .header("content-type", "application/xml")
                .body(s3s::Body::from(PRECONDITION_FAILED.to_string()))
                .expect("a 412 response"));
        }
    }
    if object_get && resp.status().is_success() && take_one(&faults.stall) {
        let (parts, body) = resp.into_parts();
        let first = s3s::dto::StreamingBlob::from(body)
            .take(1)
            .map(|r| r.map_err(|e| std::io::Error::other(e.to_string())));
        let stalled = first.chain(futures_util::stream::pending());
        let body = s3s::Body::from(s3s::dto::StreamingBlob::wrap(stalled));
        return Ok(http::Response::from_parts(parts, body));
    }
    Ok(resp)
}
