//! The store thread: a tokio runtime of its own that owns the S3 client and runs one task per
//! request.
//!
//! A client's pooled connections are driven by the runtime that opened them; used from a
//! second runtime its requests hang. So the client is built on this thread and used only here,
//! and the engine's plain threads talk to it over channels.

use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::Sender;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{Coalescing, StoreConfig};
use crate::error::{message, Cause, StoreError};
use crate::read::{Counters, Listing, ObjectInfo, RangeRead, StoreCompletion};
use crate::url::display;

/// Idle connections kept per host: at least the deepest io_depth, so that reads in flight
/// reuse their connections.
const POOL_IDLE_PER_HOST: usize = 512;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries are bounded by the request deadline; the count only stops a flood of instant
/// failures.
const MAX_RETRIES: usize = 64;
const BACKOFF_INIT: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Sends a reply at most once; if the job is dropped unanswered (the runtime stopped with it
/// in flight, or never took it), the fallback goes instead, so every request is answered.
pub(crate) struct Reply<T: Send> {
    tx: Sender<T>,
    fallback: Option<T>,
}

impl<T: Send> Reply<T> {
    pub(crate) fn new(tx: Sender<T>, fallback: T) -> Reply<T> {
        Reply {
            tx,
            fallback: Some(fallback),
        }
    }

    fn send(mut self, value: T) {
        self.fallback = None;
        let _ = self.tx.send(value);
    }

    /// The job was refused before it was queued: the caller hears it from the refusal.
    pub(crate) fn disarm(mut self) {
        self.fallback = None;
    }
}

impl<T: Send> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(v) = self.fallback.take() {
            let _ = self.tx.send(v);
        }
    }
}

/// Where a read's answer goes.
pub(crate) enum ReadReply {
    /// A session's completion queue.
    Session(Reply<StoreCompletion>),
    /// One caller waiting for it.
    Once(Reply<Result<Bytes, StoreError>>),
}

/// What the store thread is asked to do.
pub(crate) enum Job {
    Read(RangeRead, ReadReply),
    /// Reads of one object (one `If-Match`, none whole) served by one GET of `span`, sorted by
    /// offset, each answered on its own reply with its own bytes or its own error.
    Coalesced {
        span: Range<u64>,
        members: Vec<(RangeRead, Reply<StoreCompletion>)>,
    },
    Head(String, Reply<Result<ObjectInfo, StoreError>>),
    List {
        prefix: String,
        delimiter: bool,
        reply: Reply<Result<Listing, StoreError>>,
    },
    /// One LIST page of one key: does the bucket exist, and may we read it.
    Probe(Reply<Result<(), StoreError>>),
}

impl Job {
    /// Takes the reply out of a job the thread refused, so that it sends nothing.
    pub(crate) fn disarm(self) {
        match self {
            Job::Read(_, ReadReply::Session(r)) => r.disarm(),
            Job::Read(_, ReadReply::Once(r)) => r.disarm(),
            Job::Coalesced { members, .. } => members.into_iter().for_each(|(_, r)| r.disarm()),
            Job::Head(_, r) => r.disarm(),
            Job::List { reply, .. } => reply.disarm(),
            Job::Probe(r) => r.disarm(),
        }
    }
}

/// The engine's side of the store thread: its job queue and its handle. Dropping it closes
/// the queue, which ends the thread's loop, and joins the thread.
pub(crate) struct StoreThread {
    jobs: Option<mpsc::UnboundedSender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// How sessions merge their reads into GETs.
    pub(crate) coalescing: Coalescing,
}

impl StoreThread {
    /// Whether the thread takes no more jobs.
    pub(crate) fn is_stopped(&self) -> bool {
        self.jobs.as_ref().is_none_or(|j| j.is_closed())
    }

    /// Hands a job to the thread; a job it cannot take is dropped, so its replies answer
    /// [`StoreError::Stopped`].
    pub(crate) fn send_or_stop(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            // A refused job comes back in the error and drops with it.
            let _ = jobs.send(job);
        }
    }

    /// Hands a job to the thread; a job it cannot take sends no reply.
    pub(crate) fn send(&self, job: Job) -> Result<(), StoreError> {
        let Some(jobs) = &self.jobs else {
            job.disarm();
            return Err(StoreError::Stopped);
        };
        jobs.send(job).map_err(|mpsc::error::SendError(job)| {
            job.disarm();
            StoreError::Stopped
        })
    }
}

impl Drop for StoreThread {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            // Never on the store thread itself: its tasks hold no StoreThread.
            let _ = t.join();
        }
    }
}

/// What every request task needs.
struct Shared {
    client: AmazonS3,
    bucket: String,
    deadline: Duration,
    list_page_keys: usize,
    list_objects_max: usize,
    counters: Arc<Counters>,
}

/// Starts the store thread and builds its client; returns once the client is built.
pub(crate) fn start(
    config: &StoreConfig,
    bucket: &str,
    counters: Arc<Counters>,
) -> Result<StoreThread, StoreError> {
    config.check()?;
    let builder = builder(config, bucket);
    let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<(), StoreError>>(1);
    let (bucket, deadline) = (bucket.to_string(), config.request_deadline);
    let (list_page_keys, list_objects_max) = (config.list_page_keys, config.list_objects_max);
    let coalescing = config.coalescing;
    let start = |cause: Cause| StoreError::Start { cause };
    let thread = std::thread::Builder::new()
        .name("lobster-store".to_string())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(start(Arc::new(e))));
                    return;
                }
            };
            rt.block_on(async move {
                let client = match builder.build() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(StoreError::Config {
                            key: "client".to_string(),
                            reason: e.to_string(),
                        }));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let shared = Arc::new(Shared {
                    client,
                    bucket,
                    deadline,
                    list_page_keys,
                    list_objects_max,
                    counters,
                });
                while let Some(job) = rx.recv().await {
                    tokio::spawn(run(job, shared.clone()));
                }
            });
            // The runtime drops here with any task still running: their replies answer
            // Stopped.
        })
        .map_err(|e| start(Arc::new(e)))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(StoreThread {
            jobs: Some(jobs),
            thread: Some(thread),
            coalescing,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(start(message(
                "the store thread ended before its client was built",
            )))
        }
    }
}

/// The client's settings. The builder holds the secret and derives `Debug`: never print it.
fn builder(config: &StoreConfig, bucket: &str) -> AmazonS3Builder {
    let http = config
        .endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"));
    let options = ClientOptions::new()
        .with_allow_http(http)
        .with_pool_max_idle_per_host(POOL_IDLE_PER_HOST)
        .with_connect_timeout(CONNECT_TIMEOUT)
        // A stalled response is cut after this much silence and resumed by the retry.
        .with_read_timeout(config.stall_timeout)
        // No attempt outlives the request's deadline (object_store's default is 30 s).
        .with_timeout(config.request_deadline);
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: BACKOFF_INIT,
            max_backoff: BACKOFF_MAX,
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: config.request_deadline,
    };
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(&config.region)
        .with_client_options(options)
        .with_retry(retry);
    if let Some(e) = &config.endpoint {
        b = b.with_endpoint(e).with_allow_http(http);
    }
    if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
        b = b
            .with_access_key_id(id)
            .with_secret_access_key(secret.expose());
        if let Some(token) = &config.session_token {
            b = b.with_token(token.expose());
        }
    }
    b
}

async fn run(job: Job, shared: Arc<Shared>) {
    match job {
        Job::Read(read, reply) => {
            let result = get(&shared, &read).await;
            match reply {
                ReadReply::Session(r) => r.send(StoreCompletion {
                    tag: read.tag,
                    result,
                    shared: false,
                }),
                ReadReply::Once(r) => r.send(result),
            }
        }
        Job::Coalesced { span, members } => get_coalesced(&shared, span, members).await,
        Job::Head(key, reply) => reply.send(head(&shared, &key).await),
        Job::List {
            prefix,
            delimiter,
            reply,
        } => reply.send(list(&shared, &prefix, delimiter).await),
        Job::Probe(reply) => reply.send(probe(&shared).await),
    }
}

fn path(shared: &Shared, key: &str) -> Result<Path, StoreError> {
    Path::parse(key).map_err(|_| StoreError::Url {
        url: display(&shared.bucket, key),
        reason: "a key with an empty, '.' or '..' segment cannot be addressed",
    })
}

/// What a request was for, to name it in its error.
struct Target<'a> {
    url: String,
    range: Option<Range<u64>>,
    if_match: Option<&'a Arc<str>>,
}

async fn get(shared: &Shared, read: &RangeRead) -> Result<Bytes, StoreError> {
    if read.len == 0 && !read.whole_object {
        return Ok(Bytes::new());
    }
    let url = display(&shared.bucket, &read.key);
    let result = match fetch(shared, read, &url).await {
        Ok(body) => exact(read, &url, body),
        Err(e) => Err(e),
    };
    if result.is_err() {
        Counters::add(&shared.counters.failed_requests, 1);
    }
    result
}

/// One GET of `read`'s range (one byte more for a whole object, so that one that grew shows):
/// the body as received, whatever its length. A range wholly past the object's end (416) is an
/// empty body.
async fn fetch(shared: &Shared, read: &RangeRead, url: &str) -> Result<Bytes, StoreError> {
    let asked = read.range();
    let location = path(shared, &read.key)?;
    let end = asked.end.saturating_add(u64::from(read.whole_object));
    let options = GetOptions {
        range: Some(GetRange::Bounded(asked.start..end)),
        if_match: read.if_match.as_deref().map(str::to_string),
        ..GetOptions::default()
    };
    Counters::add(&shared.counters.get_requests, 1);
    let target = Target {
        url: url.to_string(),
        range: Some(asked),
        if_match: read.if_match.as_ref(),
    };
    let fetched = timed(shared, &target, async {
        shared
            .client
            .get_opts(&location, options)
            .await?
            .bytes()
            .await
    })
    .await;
    match fetched {
        Ok(body) => {
            Counters::add(&shared.counters.bytes_received, body.len() as u64);
            Ok(body)
        }
        // Nothing at or past the object's end.
        Err(StoreError::Request {
            status: Some(416), ..
        }) => Ok(Bytes::new()),
        Err(e) => Err(e),
    }
}

/// `body` as the answer to `read`: exactly its bytes, or why not.
fn exact(read: &RangeRead, url: &str, body: Bytes) -> Result<Bytes, StoreError> {
    let got = body.len() as u64;
    if got == read.len {
        Ok(body)
    } else if got < read.len {
        Err(StoreError::Short {
            url: url.to_string(),
            range: read.range(),
            got_bytes: got,
        })
    } else if read.whole_object {
        Err(StoreError::Grew {
            url: url.to_string(),
            size_bytes: read.len,
        })
    } else {
        Err(StoreError::Request {
            url: url.to_string(),
            range: Some(read.range()),
            status: None,
            cause: message(format!(
                "the server sent {got} bytes for a range of {}",
                read.len
            )),
        })
    }
}

/// One GET of `span` for all of `members` (sorted by offset), each answered with a copy of
/// its bytes of the body. A failed GET fails every member with the error rewritten to the member's own
/// range; a short body fails only the members it cuts short: one wholly inside the bytes
/// received gets them, as it would from a GET of its own.
async fn get_coalesced(
    shared: &Shared,
    span: Range<u64>,
    members: Vec<(RangeRead, Reply<StoreCompletion>)>,
) {
    let Some((first, _)) = members.first() else {
        return;
    };
    let url = display(&shared.bucket, &first.key);
    let spanning = RangeRead {
        key: first.key.clone(),
        offset: span.start,
        len: span.end - span.start,
        whole_object: false,
        if_match: first.if_match.clone(),
        tag: first.tag,
    };
    Counters::add(
        &shared.counters.coalesced_reads,
        members.len().saturating_sub(1) as u64,
    );
    let fetched = fetch(shared, &spanning, &url).await;
    if let Ok(body) = &fetched {
        let received = span.start..span.start.saturating_add(body.len() as u64);
        let gaps = uncovered_bytes(members.iter().map(|(r, _)| r.range()), received);
        Counters::add(&shared.counters.gap_bytes, gaps);
    }
    let mut failed = false;
    for (i, (read, reply)) in members.into_iter().enumerate() {
        let result = match &fetched {
            Ok(body) => member_bytes(&read, &url, &span, body),
            Err(e) => Err(for_range(e, read.range())),
        };
        failed |= result.is_err();
        reply.send(StoreCompletion {
            tag: read.tag,
            result,
            shared: i > 0,
        });
    }
    if failed {
        Counters::add(&shared.counters.failed_requests, 1);
    }
}

/// `read`'s own bytes of the body of a GET of `span`, copied: a slice would keep the whole
/// body (gaps and every other member's bytes) alive for as long as a cache keeps the sample,
/// memory its capacity never counted.
fn member_bytes(
    read: &RangeRead,
    url: &str,
    span: &Range<u64>,
    body: &Bytes,
) -> Result<Bytes, StoreError> {
    let (span_len, got) = (span.end - span.start, body.len() as u64);
    if got > span_len {
        return Err(StoreError::Request {
            url: url.to_string(),
            range: Some(read.range()),
            status: None,
            cause: message(format!(
                "the server sent {got} bytes for the range {}..{} that holds this one",
                span.start, span.end
            )),
        });
    }
    debug_assert!(span.start <= read.offset && read.range().end <= span.end);
    let start = read.offset - span.start;
    let end = start + read.len;
    if end <= got {
        // Both within the body, whose length is a usize.
        Ok(Bytes::copy_from_slice(&body[start as usize..end as usize]))
    } else {
        Err(StoreError::Short {
            url: url.to_string(),
            range: read.range(),
            got_bytes: got.saturating_sub(start),
        })
    }
}

/// A coalesced GET's error as one member's: the same failure, naming the member's range rather
/// than the GET's. Errors that name no range (no such object, access denied) stay as they are,
/// as a member's own GET would have had them.
fn for_range(e: &StoreError, range: Range<u64>) -> StoreError {
    match e.clone() {
        StoreError::Request {
            url, status, cause, ..
        } => StoreError::Request {
            url,
            range: Some(range),
            status,
            cause,
        },
        StoreError::Deadline {
            url,
            deadline,
            cause,
            ..
        } => StoreError::Deadline {
            url,
            range: Some(range),
            deadline,
            cause,
        },
        StoreError::Changed { url, etag, .. } => StoreError::Changed { url, range, etag },
        e => e,
    }
}

/// Bytes of `within` that none of `ranges` (sorted by start) covers.
fn uncovered_bytes(ranges: impl Iterator<Item = Range<u64>>, within: Range<u64>) -> u64 {
    let (mut covered, mut covered_to) = (0, within.start);
    for r in ranges {
        let (start, end) = (r.start.max(covered_to), r.end.min(within.end));
        if end > start {
            covered += end - start;
            covered_to = end;
        }
    }
    (within.end - within.start) - covered
}

async fn head(shared: &Shared, key: &str) -> Result<ObjectInfo, StoreError> {
    Counters::add(&shared.counters.head_requests, 1);
    let result = async {
        let location = path(shared, key)?;
        let target = Target {
            url: display(&shared.bucket, key),
            range: None,
            if_match: None,
        };
        let meta = timed(shared, &target, shared.client.head(&location)).await?;
        Ok(ObjectInfo {
            key: key.to_string(),
            size_bytes: meta.size,
            etag: meta.e_tag,
        })
    }
    .await;
    if result.is_err() {
        Counters::add(&shared.counters.failed_requests, 1);
    }
    result
}

async fn list(shared: &Shared, prefix: &str, delimiter: bool) -> Result<Listing, StoreError> {
    let url = display(&shared.bucket, prefix);
    let mut prefixes = Vec::new();
    let mut objects = Vec::new();
    let mut page_token = None;
    loop {
        let options = PaginatedListOptions {
            delimiter: delimiter.then_some("/".into()),
            max_keys: Some(shared.list_page_keys),
            page_token: page_token.take(),
            ..PaginatedListOptions::default()
        };
        Counters::add(&shared.counters.list_requests, 1);
        let target = Target {
            url: url.clone(),
            range: None,
            if_match: None,
        };
        let page = timed(
            shared,
            &target,
            shared
                .client
                .list_paginated((!prefix.is_empty()).then_some(prefix), options),
        )
        .await;
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                Counters::add(&shared.counters.failed_requests, 1);
                return Err(e);
            }
        };
        prefixes.extend(page.result.common_prefixes.iter().map(|p| {
            let mut p = p.as_ref().to_string();
            p.push('/');
            p
        }));
        objects.extend(page.result.objects.into_iter().map(|m| ObjectInfo {
            key: m.location.as_ref().to_string(),
            size_bytes: m.size,
            etag: m.e_tag,
        }));
        if objects.len() + prefixes.len() > shared.list_objects_max {
            Counters::add(&shared.counters.failed_requests, 1);
            return Err(StoreError::TooManyObjects {
                url,
                max: shared.list_objects_max,
            });
        }
        match page.page_token {
            Some(t) => page_token = Some(t),
            None => break,
        }
    }
    prefixes.sort_unstable();
    prefixes.dedup();
    objects.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    Ok((prefixes, objects))
}

async fn probe(shared: &Shared) -> Result<(), StoreError> {
    let options = PaginatedListOptions {
        max_keys: Some(1),
        ..PaginatedListOptions::default()
    };
    Counters::add(&shared.counters.list_requests, 1);
    let target = Target {
        url: display(&shared.bucket, ""),
        range: None,
        if_match: None,
    };
    let page = timed(shared, &target, shared.client.list_paginated(None, options)).await;
    if page.is_err() {
        Counters::add(&shared.counters.failed_requests, 1);
    }
    page.map(|_| ())
}

/// Runs one request under the deadline and names its failure.
async fn timed<T>(
    shared: &Shared,
    target: &Target<'_>,
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> Result<T, StoreError> {
    let start = Instant::now();
    match tokio::time::timeout(shared.deadline, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            let e = classify(e, shared, target);
            // The client's retry budget is the deadline: a retried failure that comes back at
            // it is the deadline's.
            match e {
                StoreError::Request { status, cause, .. }
                    if start.elapsed() >= shared.deadline
                        && matches!(status, None | Some(429) | Some(500..=599)) =>
                {
                    Err(StoreError::Deadline {
                        url: target.url.clone(),
                        range: target.range.clone(),
                        deadline: shared.deadline,
                        cause: Some(cause),
                    })
                }
                e => Err(e),
            }
        }
        Err(_) => Err(StoreError::Deadline {
            url: target.url.clone(),
            range: target.range.clone(),
            deadline: shared.deadline,
            cause: None,
        }),
    }
}

/// The HTTP status an object_store error carries in its message. object_store does not expose
/// it for errors outside its few named kinds (its retry error type is private), so it is read
/// from the text `status code: NNN` that its retry error prints.
fn status_of(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

fn classify(e: object_store::Error, shared: &Shared, target: &Target<'_>) -> StoreError {
    let text = e.to_string();
    let status = match &e {
        object_store::Error::NotFound { .. } => Some(404),
        object_store::Error::PermissionDenied { .. } => Some(403),
        object_store::Error::Unauthenticated { .. } => Some(401),
        object_store::Error::Precondition { .. } => Some(412),
        _ => status_of(&text),
    };
    let cause: Cause = Arc::new(e);
    match status {
        Some(404) if text.contains("NoSuchBucket") => StoreError::NoSuchBucket {
            url: display(&shared.bucket, ""),
            cause,
        },
        Some(404) => StoreError::NotFound {
            url: target.url.clone(),
        },
        Some(401 | 403) => StoreError::AccessDenied {
            url: target.url.clone(),
            cause,
        },
        Some(412) if target.if_match.is_some() => StoreError::Changed {
            url: target.url.clone(),
            range: target.range.clone().unwrap_or(0..0),
            etag: target.if_match.cloned().unwrap_or_else(|| Arc::from("")),
        },
        status => StoreError::Request {
            url: target.url.clone(),
            range: target.range.clone(),
            status,
            cause,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{status_of, uncovered_bytes};

    #[test]
    fn uncovered_bytes_are_the_gaps_between_sorted_ranges() {
        let within = |ranges: &[(u64, u64)], w: (u64, u64)| {
            uncovered_bytes(ranges.iter().map(|&(a, b)| a..b), w.0..w.1)
        };
        assert_eq!(within(&[(0, 10), (15, 20), (30, 40)], (0, 40)), 15);
        // Overlaps count once; a range past `within` counts up to its end.
        assert_eq!(within(&[(0, 10), (5, 12), (6, 8), (20, 50)], (0, 30)), 8);
        // A body cut short: what is past it is not a gap received.
        assert_eq!(within(&[(100, 110), (200, 210)], (100, 150)), 40);
        assert_eq!(within(&[], (3, 3)), 0);
    }

    #[test]
    fn status_is_read_from_the_retry_error_text() {
        let t = "Generic S3 error: Error performing GET http://x/b/k in 1ms - Server returned non-2xx status code: 416 Range Not Satisfiable: <Error/>";
        assert_eq!(status_of(t), Some(416));
        assert_eq!(status_of("Server returned error response: <Error/>"), None);
        assert_eq!(status_of("status code: 4"), None);
    }
}
