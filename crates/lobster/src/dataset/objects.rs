//! Datasets in an S3-compatible bucket (feature `s3`): `s3://bucket/key...` names WebDataset
//! shards (a brace pattern, one `.tar` object, or a prefix holding `.tar` objects and no
//! deeper prefix) or an ImageFolder-shaped prefix (`prefix/<class>/.../<file>`), as a local
//! path names them.
//!
//! A sample's path is its object's URL (`s3://bucket/key`), so every error names the object.
//! Shards are indexed from ranged reads of their headers (read ahead in spans, so the small
//! members between them cost no request of their own) and the labels, several shards at a
//! time; each shard's index is kept in the index directory beside local shards' indexes,
//! valid while the object has the same size and ETag. Reads send the ETag as `If-Match`, so
//! an object replaced after it was indexed is an error naming it, never other bytes.
//!
//! ```text
//! lobster-object-index 1
//! object  <url>  <size bytes>  <etag>  <written, ns>
//! <label> <image member's data offset> <its size> <probe> <key>   (a line per sample)
//! end     <check of the lines above>
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use lobster_store::{ObjectInfo, RangeRead, Store, StoreConfig, StoreError, StoreUrl};

use super::folder::{every_class_has_a_file, push_sample, FolderOptions};
use super::shards::{
    expand_braces, group, judge_all, keys_in_one_shard, number, parse_samples, write_samples,
    Indexed, Shard, ShardSamples,
};
use super::source::{Objects, Source};
use super::table::{Dataset, SampleMeta};
use super::table_file::{
    escape, fnv, now_ns, parse_sealed, read_kept, seal, split, unescape, write_atomically,
    KEPT_MAX_BYTES,
};
use super::tar_index::ReadAt;
use crate::error::Error;

/// Version 1 of an object shard's index.
const MAGIC: &[u8] = b"lobster-object-index 1";
/// Shards indexed at once: each walk waits on one request at a time.
const WALKS_MAX: usize = 8;
/// Bytes fetched per request of a header walk: read through small members rather than pay a
/// request's latency for each header.
const WALK_SPAN_BYTES: u64 = 1 << 20;

/// Opens the dataset `spec` (`s3://...`) names in the store `config` reaches (`None`: as
/// the environment says), keeping shard indexes in `index_dir` (reused when `reuse`).
pub(super) fn open(
    spec: &str,
    config: Option<&StoreConfig>,
    index_dir: Option<&Path>,
    reuse: bool,
) -> Result<Dataset, Error> {
    let named = |e: StoreError| Error::dataset(Path::new(spec), e);
    let from_env;
    let config = match config {
        Some(c) => c,
        None => {
            from_env = StoreConfig::from_env().map_err(named)?;
            &from_env
        }
    };
    if !spec.starts_with("s3://") {
        return open_list(Path::new(spec), config, index_dir, reuse);
    }
    let url = StoreUrl::parse(spec).map_err(named)?;
    let store = Store::open(config, url.bucket()).map_err(named)?;
    let key = url.key();
    let shards = if key.contains('{') {
        let keys = expand_braces(key)?;
        heads(&store, &url, &keys)?
    } else if key.ends_with(".tar") {
        vec![store.head(key).map_err(named)?]
    } else {
        let prefix = dir_prefix(key);
        let (dirs, objects) = store.list_dir(&prefix).map_err(named)?;
        let tars: Vec<ObjectInfo> = objects
            .into_iter()
            .filter(|o| o.key.ends_with(".tar"))
            .collect();
        if tars.is_empty() || !dirs.is_empty() {
            return folder(store, &url, &prefix, dirs);
        }
        if tars.iter().any(|o| o.etag.is_none()) {
            // Some servers list objects without their ETags: without one, a shard's index
            // cannot be kept nor its reads checked with If-Match. A HEAD per shard has it.
            let keys: Vec<String> = tars.into_iter().map(|o| o.key).collect();
            heads(&store, &url, &keys)?
        } else {
            tars
        }
    };
    open_shards(store, &url, shards, index_dir, reuse)
}

/// The shards the list file `list` names, an `s3://` URL a line, all in one bucket.
fn open_list(
    list: &Path,
    config: &StoreConfig,
    index_dir: Option<&Path>,
    reuse: bool,
) -> Result<Dataset, Error> {
    let at_line = |e: StoreError| Error::dataset(list, format!("list of shards: {e}"));
    let urls = super::shards::list_entries(list)?
        .iter()
        .map(|l| StoreUrl::parse(l).map_err(at_line))
        .collect::<Result<Vec<_>, Error>>()?;
    let Some(first) = urls.first() else {
        return Err(Error::dataset(list, "list of shards: no shards"));
    };
    if let Some(other) = urls.iter().find(|u| u.bucket() != first.bucket()) {
        return Err(Error::dataset(
            list,
            format!("list of shards: {other} is not in {first}'s bucket: one bucket a dataset",),
        ));
    }
    let bucket = StoreUrl::new(first.bucket(), "").map_err(|e| Error::dataset(list, e))?;
    let store = Store::open(config, bucket.bucket()).map_err(|e| Error::dataset(list, e))?;
    let keys: Vec<String> = urls.iter().map(|u| u.key().to_owned()).collect();
    let shards = heads(&store, &bucket, &keys)?;
    open_shards(store, &bucket, shards, index_dir, reuse)
}

/// The URL of `key`'s object in `url`'s bucket.
fn object_url(url: &StoreUrl, key: &str) -> String {
    format!("s3://{}/{key}", url.bucket())
}

/// `key` as a prefix of a directory's objects: `""` or ending in `/`.
fn dir_prefix(key: &str) -> String {
    match key {
        "" => String::new(),
        k if k.ends_with('/') => k.to_owned(),
        k => format!("{k}/"),
    }
}

/// Each key's object, found by HEAD requests several at a time.
fn heads(store: &Store, url: &StoreUrl, keys: &[String]) -> Result<Vec<ObjectInfo>, Error> {
    let found = in_parallel(keys.len(), |i| store.head(&keys[i]));
    found
        .into_iter()
        .zip(keys)
        .map(|(r, k)| r.map_err(|e| Error::dataset(Path::new(&object_url(url, k)), e)))
        .collect()
}

/// `f(0..n)`, up to [`WALKS_MAX`] at a time, in order.
fn in_parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..WALKS_MAX.min(n) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let r = f(i);
                out.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every item was computed"))
        .collect()
}

/// The shard dataset of `shards`, each indexed from its kept index or from its headers.
fn open_shards(
    store: Store,
    url: &StoreUrl,
    shards: Vec<ObjectInfo>,
    index_dir: Option<&Path>,
    reuse: bool,
) -> Result<Dataset, Error> {
    let paths: Vec<PathBuf> = shards
        .iter()
        .map(|o| PathBuf::from(object_url(url, &o.key)))
        .collect();
    let kept: Vec<Option<ShardSamples>> = shards
        .iter()
        .zip(&paths)
        .map(|(o, path)| {
            let at = index_dir.filter(|_| reuse)?.join(index_name(path));
            load_index(&at, path, o).unwrap_or_else(|e| {
                log::warn!("lobster-io: ignoring a shard index: {e}");
                None
            })
        })
        .collect();
    let walked = in_parallel(shards.len(), |i| match kept[i] {
        Some(_) => Ok(None),
        None => {
            let reader = ObjectReader::new(&store, &shards[i]);
            group(&reader, &paths[i]).map(Some)
        }
    });
    let mut found = Vec::with_capacity(shards.len());
    for ((kept, walked), object) in kept.into_iter().zip(walked).zip(&shards) {
        found.push(match (kept, walked?) {
            (Some(samples), _) => Shard::Indexed(samples),
            (None, Some(grouped)) => Shard::Read(grouped, object),
            (None, None) => unreachable!("a shard without an index was walked"),
        });
    }
    keys_in_one_shard(&paths, &found)?;
    let keep = index_dir.map(|dir| {
        (
            |shard: &Path| dir.join(index_name(shard)),
            |at: &Path, shard: &Path, samples: &[Indexed], object: &ObjectInfo| {
                store_index(at, shard, samples, object)
            },
        )
    });
    let indexed = judge_all(&paths, found, keep)?;
    let mut ds = Dataset::from_shards(PathBuf::from(url.to_string()), &paths, indexed)?;
    ds.source = objects_source(store, &ds.samples, &shards, url);
    Ok(ds)
}

/// The reads' view of `objects`, whose samples are `samples`.
fn objects_source(
    store: Store,
    samples: &[SampleMeta],
    objects: &[ObjectInfo],
    url: &StoreUrl,
) -> Source {
    let by_url: HashMap<String, &ObjectInfo> = objects
        .iter()
        .map(|o| (object_url(url, &o.key), o))
        .collect();
    let mut map = HashMap::with_capacity_and_hasher(objects.len(), ahash::RandomState::new());
    for s in samples {
        if map.contains_key(&s.path) {
            continue;
        }
        let o = by_url[s.path.to_str().expect("an object's URL is UTF-8")];
        map.insert(
            Arc::clone(&s.path),
            (Arc::from(o.key.as_str()), o.etag.as_deref().map(Arc::from)),
        );
    }
    Source::Objects(Arc::new(Objects::new(store, map)))
}

/// The file name of the index of the shard at URL `shard`.
fn index_name(shard: &Path) -> String {
    format!("object-{:016x}.idx", fnv(&[shard.as_os_str().as_bytes()]))
}

/// Keeps `samples` as the index of `shard` (`object`) at `at`; `None` when the object has
/// no ETag to check it against later.
fn store_index(
    at: &Path,
    shard: &Path,
    samples: &[Indexed],
    object: &ObjectInfo,
) -> std::io::Result<Option<u64>> {
    let Some(etag) = &object.etag else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(64 + 48 * samples.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(b"\nobject\t");
    escape(shard.as_os_str().as_bytes(), &mut out);
    out.extend_from_slice(format!("\t{}\t", object.size_bytes).as_bytes());
    escape(etag.as_bytes(), &mut out);
    out.extend_from_slice(format!("\t{}\n", now_ns()).as_bytes());
    write_samples(samples, &mut out);
    let check = seal(&mut out);
    write_atomically(at, &out)?;
    Ok(Some(check))
}

/// The samples of `shard` (`object`) from its index at `at`, if it exists and was written
/// for the object as it is now: its URL, size and ETag.
///
/// # Errors
/// An index that cannot be read or is malformed, naming it.
fn load_index(at: &Path, shard: &Path, object: &ObjectInfo) -> Result<Option<ShardSamples>, Error> {
    let named = |e: String| Error::dataset(at, format!("shard index: {e}"));
    let bytes = match read_kept(at, KEPT_MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(named(e.to_string())),
    };
    let Some(etag) = &object.etag else {
        return Ok(None);
    };
    let sealed = parse_sealed(bytes, MAGIC).map_err(named)?;
    let mut lines = split(&sealed.bytes[sealed.lines_at..], b'\n');
    let mut head = split(lines.next().unwrap_or_default(), b'\t');
    let same = head.next() == Some(b"object")
        && head.next().and_then(unescape).as_deref() == Some(shard.as_os_str().as_bytes())
        && number(head.next()) == Some(i128::from(object.size_bytes))
        && head.next().and_then(unescape).as_deref() == Some(etag.as_bytes());
    if !same {
        return Ok(None);
    }
    let samples = parse_samples(lines, object.size_bytes).map_err(named)?;
    Ok(Some(ShardSamples {
        samples,
        kept: Some((at.to_path_buf(), sealed.check)),
    }))
}

/// An object read through [`ReadAt`] for a header walk: each miss fetches a span from the
/// missed offset on, so the headers and small members after it cost no request.
struct ObjectReader<'a> {
    store: &'a Store,
    object: &'a ObjectInfo,
    key: Arc<str>,
    /// The span last fetched: its offset and bytes.
    span: RefCell<(u64, Bytes)>,
}

impl<'a> ObjectReader<'a> {
    fn new(store: &'a Store, object: &'a ObjectInfo) -> Self {
        ObjectReader {
            store,
            object,
            key: Arc::from(object.key.as_str()),
            span: RefCell::new((0, Bytes::new())),
        }
    }
}

impl ReadAt for ObjectReader<'_> {
    fn len_bytes(&self) -> std::io::Result<u64> {
        Ok(self.object.size_bytes)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.object.size_bytes {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut span = self.span.borrow_mut();
        let (at, bytes) = &*span;
        if offset < *at || end > at + bytes.len() as u64 {
            let len = (buf.len() as u64)
                .max(WALK_SPAN_BYTES)
                .min(self.object.size_bytes - offset);
            let read = RangeRead {
                key: Arc::clone(&self.key),
                offset,
                len,
                whole_object: false,
                if_match: self.object.etag.as_deref().map(Arc::from),
                tag: 0,
            };
            let fetched = self.store.get(&read).map_err(std::io::Error::other)?;
            *span = (offset, fetched);
        }
        let (at, bytes) = &*span;
        let from = (offset - at) as usize;
        buf.copy_from_slice(&bytes[from..from + buf.len()]);
        Ok(())
    }
}

/// The ImageFolder-shaped dataset under `prefix` (classes: `dirs`, its sub-prefixes), in
/// torchvision's order: classes by name, then each class's objects grouped by the
/// "directory" of their key, directories by path, files in each by name.
fn folder(store: Store, url: &StoreUrl, prefix: &str, dirs: Vec<String>) -> Result<Dataset, Error> {
    let root = object_url(url, prefix.trim_end_matches('/'));
    if dirs.is_empty() {
        return Err(Error::dataset(
            Path::new(&root),
            "no .tar objects and no class prefixes (expected prefix/<class>/<file>)",
        ));
    }
    let listed = in_parallel(dirs.len(), |i| store.list(&dirs[i]));
    let options = FolderOptions::default();
    let mut samples = Vec::new();
    let mut classes = Vec::with_capacity(dirs.len());
    let mut empty = Vec::new();
    let mut objects = Vec::new();
    let key_at = object_url(url, prefix).len();
    for (label, (dir, listed)) in dirs.iter().zip(listed).enumerate() {
        let listed = listed.map_err(|e| Error::dataset(Path::new(&object_url(url, dir)), e))?;
        let name = dir[prefix.len()..].trim_end_matches('/').to_owned();
        let files = torchvision_order(dir, listed, &options);
        if files.is_empty() {
            empty.push(name.clone());
        }
        for o in files {
            let path = object_url(url, &o.key);
            let id = super::table::range_id(samples.len(), o.size_bytes)
                .map_err(|what| Error::dataset(Path::new(&path), what))?;
            push_sample(
                &mut samples,
                id as usize,
                Path::new(&path),
                key_at,
                label as u32,
                o.size_bytes,
            )
            .map_err(|what| Error::dataset(Path::new(&path), what))?;
            objects.push(o);
        }
        classes.push(name);
    }
    every_class_has_a_file(Path::new(&root), &empty, &options)?;
    let source = objects_source(store, &samples, &objects, url);
    let mut ds = Dataset::of_samples(PathBuf::from(root), classes, samples);
    ds.source = source;
    Ok(ds)
}

/// The sample objects of one class prefix `dir`, in `sorted(os.walk(dir))` order.
fn torchvision_order(
    dir: &str,
    listed: Vec<ObjectInfo>,
    options: &FolderOptions,
) -> Vec<ObjectInfo> {
    let class_dir = dir.trim_end_matches('/');
    let mut files: Vec<(String, ObjectInfo)> = listed
        .into_iter()
        .filter(|o| {
            let name = o.key.rsplit('/').next().unwrap_or_default();
            options.is_sample(std::ffi::OsStr::new(name))
        })
        .map(|o| {
            let parent = o.key.rsplit_once('/').map_or("", |(p, _)| p);
            let parent = if parent.len() < class_dir.len() {
                class_dir.to_owned()
            } else {
                parent.to_owned()
            };
            (parent, o)
        })
        .collect();
    // Python compares the walk's directory paths as strings, then the names in each.
    files.sort_by(|(pa, a), (pb, b)| pa.cmp(pb).then_with(|| a.key.cmp(&b.key)));
    files.into_iter().map(|(_, o)| o).collect()
}
