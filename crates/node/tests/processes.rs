//! The node's host and its rank processes, as real processes: this test binary runs again
//! as a rank (or as a host that is also local rank 0) when `LOBSTER_NODE_TEST_ROLE` is set,
//! through its `child` test. Each test checks afterwards that no child is left, that nothing
//! was left in /dev/shm or the temporary directory, and that this process's descriptors are
//! back to their count.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_io::{CachePolicy, Dataset, Loader, LoaderBuilder, LoaderConfig};
use lobster_node::{fingerprint, HostOptions, NodeEnv, NodeError, NodeHost, NodeRank, HELLOS_MAX};

const RANKS: usize = 4;
const BATCH: usize = 4;
const EPOCHS: u32 = 3;
const SAMPLES: u32 = 96;
/// Starts each line a child prints for the parent.
const MARK: &str = "@@lobster-node@@ ";

/// One test at a time: each compares /dev/shm, the temporary directory and this process's
/// descriptors before and after, which a test running beside it would change.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sample `i`'s bytes: its id, repeated, a length that varies. Smaller than the kit's
/// `content`, so that a batch fits the node's slots.
fn content(i: u32) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.resize(64 + (i as usize * 37) % 900, (i % 251) as u8);
    v
}

/// An ImageFolder of [`content`] in `dir/data`, 3 classes.
fn make_dataset(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    lobster_testkit::data::write_image_folder(&root, SAMPLES, 3, content);
    root
}

fn open(root: &Path) -> Arc<Dataset> {
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(root, &options).unwrap())
}

/// The node's loader configuration; `seed` differs only where a test wants a mismatch.
fn config(seed: u64) -> (LoaderConfig, u64) {
    let c = LoaderConfig {
        job: lobster_io::JobConfig {
            ranks_per_node: RANKS,
            batch_size: BATCH,
            epochs: EPOCHS,
            ..Default::default()
        },
        cache: lobster_io::CacheConfig {
            policy: CachePolicy::Reuse,
            capacity_bytes: 16 << 10,
            ..Default::default()
        },
        budgets: lobster_io::BudgetConfig {
            decode_threads: RANKS,
            ..Default::default()
        },
        ..LoaderConfig::default()
    };
    (c, seed)
}

fn loader(ds: &Arc<Dataset>, seed: u64) -> Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .config(config(seed).0)
        .seed(seed)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap()
}

fn env(job: &str, local_rank: usize) -> NodeEnv {
    NodeEnv::new(local_rank, RANKS, local_rank, RANKS, 0, 1, job).unwrap()
}

fn options() -> HostOptions {
    HostOptions {
        slots_per_rank: 3,
        slot_bytes: 8 << 10,
        attach_timeout: Duration::from_secs(30),
    }
}

/// Starts a host of `job` over the node's loader in this process.
fn host(ds: &Arc<Dataset>, job: &str, seed: u64, options: HostOptions) -> NodeHost {
    let (cfg, _) = config(seed);
    NodeHost::start(
        &env(job, 0),
        loader(ds, seed),
        fingerprint(ds, &cfg, seed),
        options,
    )
    .unwrap()
}

/// A test's start: one test at a time, a dataset in a fresh directory, and what must be
/// the same at the end. Fields drop in order: the directory goes and leftover children are
/// killed before the serial lock lets the next test take its snapshot.
struct Setup {
    dir: tempfile::TempDir,
    data: PathBuf,
    ds: Arc<Dataset>,
    clean: Clean,
    _kill: KillOnDrop,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// Kills the children a failed test left (dropped before the serial lock is released).
struct KillOnDrop;

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill_unreaped();
    }
}

fn setup() -> Setup {
    let serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = make_dataset(dir.path());
    let ds = open(&data);
    let clean = Clean::before(dir.path());
    Setup {
        dir,
        data,
        ds,
        clean,
        _kill: KillOnDrop,
        _serial: serial,
    }
}

/// What a rank process saw: its batches' ids in order, and how it ended.
#[derive(Debug, Default)]
struct Seen {
    batches: Vec<Vec<u32>>,
    end: String,
    /// Every other line it printed for the parent.
    lines: Vec<String>,
}

/// Runs as a child when the role is set; a plain no-op test otherwise.
#[test]
fn child() {
    let Ok(role) = std::env::var("LOBSTER_NODE_TEST_ROLE") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let job = var("LOBSTER_JOB_ID");
    let local_rank: usize = var("LOBSTER_LOCAL_RANK").parse().unwrap();
    // These two may run as another user, who cannot read the test's dataset.
    match role.as_str() {
        "stranger" => stranger(&job, local_rank),
        "squatter" => squatter(&job),
        _ => {}
    }
    let seed: u64 = var("LOBSTER_TEST_SEED").parse().unwrap();
    let slow = Duration::from_millis(var("LOBSTER_TEST_SLOW_MS").parse().unwrap());
    let ds = open(Path::new(&var("LOBSTER_TEST_DATA")));
    let (cfg, _) = config(seed);
    let env = env(&job, local_rank);
    let host = (role == "host").then(|| {
        NodeHost::start(
            &env,
            loader(&ds, seed),
            fingerprint(&ds, &cfg, seed),
            options(),
        )
        .unwrap()
    });
    let out = match NodeRank::attach(&env, fingerprint(&ds, &cfg, seed), Duration::from_secs(30)) {
        Ok(rank) => run_rank(rank, &ds, slow),
        Err(e) => format!("error {e}"),
    };
    println!("{MARK}{out}");
    if let Some(h) = host {
        let _ = h.wait();
    }
    std::process::exit(if out == "end" { 0 } else { 3 });
}

/// Another user's process: tries to attach as `local_rank` with the host's own configuration
/// (from `LOBSTER_TEST_CONFIG`), then with a wrong seed; prints how each went.
fn stranger(job: &str, local_rank: usize) -> ! {
    let config: Vec<(String, String)> = std::env::var("LOBSTER_TEST_CONFIG")
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let mut wrong = config.clone();
    for (k, v) in &mut wrong {
        if k == "seed" {
            v.push('1');
        }
    }
    let env = env(job, local_rank);
    for (attempt, config) in [("first", config), ("second", wrong)] {
        match NodeRank::attach(&env, config, Duration::from_secs(20)) {
            Ok(rank) => {
                println!("{MARK}{attempt} attached to host pid {}", rank.host_pid());
                // Holds its place a moment, as an intruder would.
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => println!("{MARK}{attempt} refused: {e}"),
        }
    }
    std::process::exit(0);
}

/// A process holding the host's name first: prints when it listens, then how many bytes the
/// first connection sent it before closing.
fn squatter(job: &str) -> ! {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let address = env(job, 0).address();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(address.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    println!("{MARK}listening");
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = 0;
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(3)))
                    .unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = stream.read(&mut buf) {
                    got += n;
                }
                break;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("no connection came: {e}"),
        }
    }
    println!("{MARK}got {got}");
    std::process::exit(0);
}

/// Takes every batch, checking each sample's bytes; prints a line per batch.
fn run_rank(mut rank: NodeRank, ds: &Dataset, slow: Duration) -> String {
    let mut step = 0;
    while let Some(batch) = rank.next() {
        match batch {
            Ok(b) => {
                for (i, p) in b.samples.iter().enumerate() {
                    let file = std::fs::read(&ds.samples()[p.id as usize].path).unwrap();
                    assert_eq!(b.bytes(i), file, "sample {}", p.id);
                }
                let ids: Vec<String> = b.samples.iter().map(|p| p.id.to_string()).collect();
                println!("{MARK}batch {}", ids.join(","));
                std::thread::sleep(slow);
            }
            Err(e) => return format!("error {e}"),
        }
        // Every rank meets the others at the end of each step, as training would.
        if let Err(e) = rank.step(step, false) {
            return format!("error {e}");
        }
        step += 1;
    }
    "end".into()
}

/// Children spawned and not yet reaped: killed if a test fails before reaping them (an
/// unreaped child's pid cannot have been reused).
static UNREAPED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn reaped(pid: u32) {
    UNREAPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
}

fn kill_unreaped() {
    for pid in std::mem::take(&mut *UNREAPED.lock().unwrap_or_else(|e| e.into_inner())) {
        // SAFETY: plain system calls on a child of this process not yet waited for.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

fn spawn(role: &str, job: &str, local_rank: usize, data: &Path, seed: u64, slow_ms: u64) -> Child {
    let child = spawn_child(role, job, local_rank, data, seed, slow_ms);
    UNREAPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child.id());
    child
}

fn spawn_child(
    role: &str,
    job: &str,
    local_rank: usize,
    data: &Path,
    seed: u64,
    slow_ms: u64,
) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads", "1"])
        .env("LOBSTER_NODE_TEST_ROLE", role)
        .env("LOBSTER_JOB_ID", job)
        .env("LOBSTER_LOCAL_RANK", local_rank.to_string())
        .env("LOBSTER_TEST_SEED", seed.to_string())
        .env("LOBSTER_TEST_SLOW_MS", slow_ms.to_string())
        .env("LOBSTER_TEST_DATA", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Runs this binary's `child` test in `role`, as user and group `uid` when given.
fn spawn_as(
    role: &str,
    job: &str,
    local_rank: usize,
    uid: Option<u32>,
    vars: &[(&str, &str)],
) -> Child {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--nocapture", "--test-threads", "1"])
        .env("LOBSTER_NODE_TEST_ROLE", role)
        .env("LOBSTER_JOB_ID", job)
        .env("LOBSTER_LOCAL_RANK", local_rank.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        c.env(k, v);
    }
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    let child = c.spawn().unwrap();
    UNREAPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child.id());
    child
}

/// Reads a child's lines until it exits (or `deadline`, then kills it and fails).
fn collect(mut child: Child, deadline: Instant) -> (Seen, Option<i32>) {
    let out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = Seen::default();
        for line in BufReader::new(out).lines() {
            let line = line.unwrap();
            // libtest's own words may share a line with ours.
            let Some(at) = line.find(MARK) else { continue };
            let line = &line[at + MARK.len()..];
            if let Some(ids) = line.strip_prefix("batch ") {
                seen.batches.push(
                    ids.split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse().unwrap())
                        .collect(),
                );
            } else if line == "end" || line.starts_with("error ") {
                seen.end = line.to_owned();
            } else {
                seen.lines.push(line.to_owned());
            }
        }
        seen
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            reaped(child.id());
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            reaped(child.id());
            panic!("a child outlived its deadline");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (reader.join().unwrap(), status.code())
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn tmp_without(ours: &Path) -> Vec<PathBuf> {
    listing(&std::env::temp_dir())
        .into_iter()
        .filter(|p| p != ours)
        .collect()
}

/// What must hold after every test: nothing left behind.
struct Clean {
    fds: usize,
    shm: Vec<PathBuf>,
    tmp: Vec<PathBuf>,
}

impl Clean {
    /// Taken after the test's own temporary directory `ours` exists.
    fn before(ours: &Path) -> Self {
        Clean {
            fds: fds(),
            shm: listing(Path::new("/dev/shm")),
            tmp: tmp_without(ours),
        }
    }

    fn check(self, ours: &Path) {
        assert_eq!(listing(Path::new("/dev/shm")), self.shm, "/dev/shm changed");
        assert_eq!(
            tmp_without(ours),
            self.tmp,
            "the temporary directory changed"
        );
        // Descriptors close as the host's last threads end.
        let deadline = Instant::now() + Duration::from_secs(5);
        while fds() != self.fds && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(fds(), self.fds, "descriptors left open");
    }
}

/// A job id no other test or run shares.
fn job(name: &str) -> String {
    format!("test-{}-{name}", std::process::id())
}

/// The in-process loader's batches per rank: the reference.
fn in_process(ds: &Arc<Dataset>, seed: u64) -> (Vec<Vec<Vec<u32>>>, (u64, u64)) {
    let mut l = loader(ds, seed);
    let ranks = l.ranks().unwrap();
    let per_rank = std::thread::scope(|s| {
        let t: Vec<_> = ranks
            .into_iter()
            .map(|h| {
                s.spawn(move || {
                    h.map(|b| b.unwrap().samples.iter().map(|x| x.id).collect())
                        .collect::<Vec<Vec<u32>>>()
                })
            })
            .collect();
        t.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let m = l.metrics();
    (per_rank, (m.hits, m.accesses))
}

#[test]
fn four_rank_processes_get_what_the_in_process_loader_gives() {
    let fixture = setup();
    let (want, want_hits) = in_process(&fixture.ds, 5);
    let job = job("same");
    let seed = 5;
    let host = host(&fixture.ds, &job, seed, options());
    let deadline = Instant::now() + Duration::from_secs(120);
    let children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 0))
        .collect();
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    let m = host.wait().unwrap();
    for (r, (s, code)) in seen.iter().enumerate() {
        assert_eq!((s.end.as_str(), *code), ("end", Some(0)), "rank {r}");
        assert_eq!(s.batches, want[r], "rank {r}'s batches");
    }
    assert_eq!((m.hits, m.accesses), want_hits, "hits and accesses");
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn a_rank_killed_mid_epoch_stops_the_others_with_an_error() {
    let fixture = setup();
    let job = job("kill-rank");
    let seed = 1;
    let host = host(&fixture.ds, &job, seed, options());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 30))
        .collect();
    // Let a few batches through, then kill local rank 2.
    std::thread::sleep(Duration::from_millis(300));
    let victim = children.remove(2);
    let mut victim = victim;
    victim.kill().unwrap();
    victim.wait().unwrap();
    reaped(victim.id());
    // Its pipe is the test's descriptor, not the host's.
    drop(victim);
    let killed_at = Instant::now();
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    let e = host.wait().unwrap_err();
    assert!(matches!(e, NodeError::RankGone { rank: 2, .. }), "{e}");
    for (s, code) in &seen {
        assert_eq!(*code, Some(3), "{s:?}");
        assert!(s.end.contains("local rank 2"), "{}", s.end);
        assert!(s.batches.len() < (SAMPLES as usize / RANKS / BATCH) * EPOCHS as usize);
    }
    assert!(killed_at.elapsed() < Duration::from_secs(30));
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn the_host_killed_mid_epoch_is_named_by_every_rank() {
    let fixture = setup();
    let job = job("kill-host");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut host = spawn("host", &job, 0, &fixture.data, 2, 30);
    let host_pid = host.id();
    let children: Vec<Child> = (1..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, 2, 30))
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    host.kill().unwrap();
    host.wait().unwrap();
    reaped(host.id());
    drop(host);
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    for (s, code) in &seen {
        assert_eq!(*code, Some(3), "{s:?}");
        assert!(
            s.end.contains("host") && s.end.contains(&host_pid.to_string()),
            "{}",
            s.end
        );
    }
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn a_mismatched_configuration_is_refused_naming_the_field() {
    let fixture = setup();
    let job = job("mismatch");
    let seed = 3;
    let options = HostOptions {
        attach_timeout: Duration::from_secs(3),
        ..options()
    };
    let host = host(&fixture.ds, &job, seed, options);
    let deadline = Instant::now() + Duration::from_secs(60);
    let wrong = spawn("rank", &job, 1, &fixture.data, 4, 0);
    let (s, code) = collect(wrong, deadline);
    assert_eq!(code, Some(3));
    assert!(
        s.end.contains("seed") && s.end.contains('3') && s.end.contains('4'),
        "{}",
        s.end
    );
    // The others never came: the host gives up naming them.
    let e = host.wait().unwrap_err().to_string();
    assert!(e.contains("did not attach"), "{e}");
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn two_jobs_at_once_never_meet() {
    let fixture = setup();
    let (want_a, _) = in_process(&fixture.ds, 7);
    let (want_b, _) = in_process(&fixture.ds, 8);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut hosts = Vec::new();
    let mut children = BTreeMap::new();
    for (name, seed) in [("a", 7u64), ("b", 8)] {
        let job = job(&format!("two-{name}"));
        hosts.push(host(&fixture.ds, &job, seed, options()));
        for r in 0..RANKS {
            children.insert((name, r), spawn("rank", &job, r, &fixture.data, seed, 0));
        }
    }
    let seen: BTreeMap<_, _> = children
        .into_iter()
        .map(|(k, c)| (k, collect(c, deadline)))
        .collect();
    for h in hosts {
        h.wait().unwrap();
    }
    for r in 0..RANKS {
        assert_eq!(seen[&("a", r)].0.batches, want_a[r]);
        assert_eq!(seen[&("b", r)].0.batches, want_b[r]);
    }
    assert_ne!(want_a, want_b);
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn ranks_started_before_the_host_wait_for_it_and_give_up_naming_it() {
    let fixture = setup();
    // No host at all: refused after the timeout, naming where it looked.
    let lonely = job("no-host");
    let (cfg, seed) = config(6);
    let started = Instant::now();
    let e = NodeRank::attach(
        &env(&lonely, 1),
        fingerprint(&fixture.ds, &cfg, seed),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(&e, NodeError::NoHost { address, .. } if address.contains(&lonely)),
        "{e}"
    );
    // Ranks first, the host half a second later: they wait for it and run to the end.
    let job = job("late-host");
    let deadline = Instant::now() + Duration::from_secs(120);
    let children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 0))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let host = host(&fixture.ds, &job, seed, options());
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    host.wait().unwrap();
    for (s, code) in &seen {
        assert_eq!((s.end.as_str(), *code), ("end", Some(0)));
    }
    fixture.clean.check(fixture.dir.path());
}

/// The unprivileged user the tests run strangers and squatters as.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn another_user_is_refused_and_learns_nothing() {
    if !is_root() {
        eprintln!(
            "another_user_is_refused_and_learns_nothing: skipped: running a process as another \
             user needs root (setuid), and this test runs as uid {}",
            // SAFETY: as in is_root.
            unsafe { libc::geteuid() }
        );
        return;
    }
    let fixture = setup();
    let job = job("stranger");
    let seed = 9;
    let host = host(&fixture.ds, &job, seed, options());
    let (cfg, _) = config(seed);
    let fp = fingerprint(&fixture.ds, &cfg, seed);
    let lines: Vec<String> = fp.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Another user, with the right configuration, as a rank not yet attached.
    let stranger = spawn_as(
        "stranger",
        &job,
        RANKS - 1,
        Some(NOBODY),
        &[("LOBSTER_TEST_CONFIG", &lines.join("\n"))],
    );
    let (seen, code) = collect(stranger, deadline);
    assert_eq!(code, Some(0), "{seen:?}");
    assert_eq!(seen.lines.len(), 2, "{seen:?}");
    for line in &seen.lines {
        assert!(
            line.contains("refused") && line.contains("only the host's own user or root"),
            "{line}"
        );
        // Not one of the host's fields or values (the address aside: it holds the job id).
        let said = line.replace(&env(&job, 0).address(), "");
        for (k, v) in &fp {
            assert!(!said.contains(&format!(" {k}")), "{k} in {line}");
            assert!(!said.contains(v.as_str()) || v.len() < 3, "{v} in {line}");
        }
    }
    // The real ranks, the stranger's rank among them, all attach and run to the end.
    let children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 0))
        .collect();
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    host.wait().unwrap();
    for (r, (s, code)) in seen.iter().enumerate() {
        assert_eq!((s.end.as_str(), *code), ("end", Some(0)), "rank {r}");
    }
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn a_trickling_or_silent_connection_does_not_hold_up_the_ranks() {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    let fixture = setup();
    let job = job("slow-loris");
    let seed = 4;
    let host = host(&fixture.ds, &job, seed, options());
    let addr = SocketAddr::from_abstract_name(env(&job, 0).address().as_bytes()).unwrap();
    // One says a frame of 200 bytes is coming, then sends a byte every 200 ms; one says
    // nothing and reads nothing. Both connect before any rank.
    let mut trickler = UnixStream::connect_addr(&addr).unwrap();
    let mut silent = UnixStream::connect_addr(&addr).unwrap();
    let guard = Duration::from_secs(60);
    let trickling = std::thread::spawn(move || {
        let started = Instant::now();
        let mut bytes = 200u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[7; 200]);
        for b in bytes {
            if trickler.write_all(&[b]).is_err() {
                return true; // the host cut it off
            }
            if started.elapsed() > guard {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let deadline = Instant::now() + Duration::from_secs(45);
    let children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 0))
        .collect();
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    host.wait().unwrap();
    for (r, (s, code)) in seen.iter().enumerate() {
        assert_eq!((s.end.as_str(), *code), ("end", Some(0)), "rank {r}");
    }
    // Both are dropped by the host in the end, not served forever.
    assert!(
        trickling.join().unwrap(),
        "the trickling hello was never cut off"
    );
    silent.set_read_timeout(Some(guard)).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        silent.read(&mut buf).unwrap(),
        0,
        "the silent connection was never closed"
    );
    drop(silent);
    fixture.clean.check(fixture.dir.path());
}

#[test]
fn a_squatter_on_the_hosts_name_is_detected() {
    let fixture = setup();
    let job = job("squatter");
    let address = env(&job, 0).address();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Another user when root can make one; this user otherwise.
    let uid = is_root().then_some(NOBODY);
    let squatter = spawn_as("squatter", &job, 0, uid, &[]);
    // Its name shows in /proc/net/unix, as anyone's does.
    let listed = format!("@{address}");
    while !std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .any(|l| l.ends_with(&listed))
    {
        assert!(Instant::now() < deadline, "the squatter never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A host cannot listen, and says why.
    let (cfg, seed) = config(3);
    let e = NodeHost::start(
        &env(&job, 0),
        loader(&fixture.ds, seed),
        fingerprint(&fixture.ds, &cfg, seed),
        options(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&address) && e.contains("held by another process"),
        "{e}"
    );
    // A rank says nothing to a squatter of another user, and names it.
    let e = NodeRank::attach(
        &env(&job, 1),
        fingerprint(&fixture.ds, &cfg, seed),
        Duration::from_secs(10),
    )
    .unwrap_err()
    .to_string();
    let (seen, code) = collect(squatter, deadline);
    assert_eq!(code, Some(0), "{seen:?}");
    match uid {
        Some(uid) => {
            assert!(e.contains(&format!("runs as uid {uid}")), "{e}");
            assert_eq!(
                seen.lines,
                ["listening", "got 0"],
                "the squatter heard the hello"
            );
        }
        None => eprintln!(
            "a_squatter_on_the_hosts_name_is_detected: a squatter of another user not tried: \
             that needs root (setuid); a squatter of this user is this user's own process"
        ),
    }
    fixture.clean.check(fixture.dir.path());
}

/// This process's threads reading a hello (their names cut to 15 bytes by the kernel).
fn hello_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "lobster-host-he")
        .count()
}

#[test]
fn hellos_in_progress_are_capped_and_the_rest_wait_their_turn() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    let fixture = setup();
    let job = job("hellos-cap");
    let seed = 2;
    let host = host(&fixture.ds, &job, seed, options());
    let addr = SocketAddr::from_abstract_name(env(&job, 0).address().as_bytes()).unwrap();
    // More silent connections than the cap: the host reads the cap's worth, no more.
    let silent: Vec<UnixStream> = (0..HELLOS_MAX + 8)
        .map(|_| UnixStream::connect_addr(&addr).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hello_threads() < HELLOS_MAX {
        assert!(
            Instant::now() < deadline,
            "{} hello threads",
            hello_threads()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(hello_threads(), HELLOS_MAX, "hellos past the cap");
    // Ranks queue behind them; once the silent ones close, every rank attaches.
    let deadline = Instant::now() + Duration::from_secs(60);
    let children: Vec<Child> = (0..RANKS)
        .map(|r| spawn("rank", &job, r, &fixture.data, seed, 0))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    drop(silent);
    let seen: Vec<(Seen, Option<i32>)> =
        children.into_iter().map(|c| collect(c, deadline)).collect();
    host.wait().unwrap();
    for (r, (s, code)) in seen.iter().enumerate() {
        assert_eq!((s.end.as_str(), *code), ("end", Some(0)), "rank {r}");
    }
    fixture.clean.check(fixture.dir.path());
}
