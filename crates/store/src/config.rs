//! Endpoint, region, credentials and time bounds of a store, from the environment and the AWS
//! profile files.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::StoreError;
use crate::profile::{self, FileKind, ProfileValues};
use crate::secret::Secret;

/// Region used when nothing names one (S3's own default).
pub const DEFAULT_REGION: &str = "us-east-1";
/// Total time for one request, its retries included.
pub const DEFAULT_REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// Longest wait for the next bytes of a response before the attempt is cut and retried.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys per LIST page (S3's most).
pub const DEFAULT_LIST_PAGE_KEYS: usize = 1000;
/// Most objects one listing returns.
pub const DEFAULT_LIST_OBJECTS_MAX: usize = 10_000_000;
/// Largest gap between two reads of one object that one GET bridges. A gap is worth fetching
/// when it costs less than a request's latency at the link's bandwidth: 20 ms at 100 Mbit/s is
/// 250 KB, so 256 KiB.
pub const DEFAULT_COALESCE_GAP_BYTES: u64 = 256 << 10;
/// Largest span of one coalesced GET: big enough to carry many samples of a shard in one
/// request, small enough that one failure or one slow body holds few samples back.
pub const DEFAULT_COALESCE_SPAN_BYTES: u64 = 8 << 20;

/// How to reach an S3-compatible store. `Debug` prints no credential.
#[derive(Clone)]
pub struct StoreConfig {
    pub(crate) endpoint: Option<String>,
    pub(crate) region: String,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<Secret>,
    pub(crate) session_token: Option<Secret>,
    pub(crate) request_deadline: Duration,
    pub(crate) stall_timeout: Duration,
    pub(crate) list_page_keys: usize,
    pub(crate) list_objects_max: usize,
    pub(crate) coalescing: Coalescing,
    /// Where the credentials came from, for `Debug`.
    credentials_from: &'static str,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            endpoint: None,
            region: DEFAULT_REGION.to_string(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            request_deadline: DEFAULT_REQUEST_DEADLINE,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            list_page_keys: DEFAULT_LIST_PAGE_KEYS,
            list_objects_max: DEFAULT_LIST_OBJECTS_MAX,
            coalescing: Coalescing {
                gap_bytes: DEFAULT_COALESCE_GAP_BYTES,
                span_bytes: DEFAULT_COALESCE_SPAN_BYTES,
            },
            credentials_from: "none",
        }
    }
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials", &self.credentials_from)
            .field("session_token", &self.session_token.is_some())
            .field("request_deadline", &self.request_deadline)
            .field("stall_timeout", &self.stall_timeout)
            .field("list_page_keys", &self.list_page_keys)
            .field("list_objects_max", &self.list_objects_max)
            .field("coalesce_gap_bytes", &self.coalescing.gap_bytes)
            .field("coalesce_span_bytes", &self.coalescing.span_bytes)
            .finish()
    }
}

impl StoreConfig {
    /// The configuration of this process's environment: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
    /// `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `AWS_PROFILE`, `AWS_CONFIG_FILE`,
    /// `AWS_SHARED_CREDENTIALS_FILE`, and the profile files under `$HOME/.aws`. See
    /// [`StoreConfig::from_vars`].
    pub fn from_env() -> Result<StoreConfig, StoreError> {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        StoreConfig::from_vars(|k| std::env::var(k).ok(), home.as_deref())
    }

    /// The configuration `vars` (the environment, or a test's table) and the profile files
    /// give. An empty variable counts as unset.
    ///
    /// - Credentials come as a set, from the first place that has a key id: the environment,
    ///   then the profile in the credentials file, then in the config file. A key id without
    ///   its secret is an error naming where it was.
    /// - Region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, `us-east-1`.
    /// - Endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's `s3 =` then own
    ///   `endpoint_url`; none means AWS's own for the region.
    /// - The profile is `AWS_PROFILE` or `default`; one named by `AWS_PROFILE` must exist in
    ///   one of the files. The files are `AWS_CONFIG_FILE` (else `home/.aws/config`) and
    ///   `AWS_SHARED_CREDENTIALS_FILE` (else `home/.aws/credentials`); a missing file is empty.
    ///
    /// Without any credentials the client falls back to object_store's own sources (instance
    /// metadata, container credentials).
    pub fn from_vars(
        vars: impl Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<StoreConfig, StoreError> {
        let var = |k: &str| vars(k).filter(|v| !v.is_empty());
        let named_profile = var("AWS_PROFILE");
        let profile = named_profile
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let file = |key: &str, default: &str| {
            var(key)
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".aws").join(default)))
        };
        let read = |path: &Option<PathBuf>, kind| -> Result<ProfileValues, StoreError> {
            match path {
                Some(p) => Ok(profile::read(p, kind, &profile)?.unwrap_or_default()),
                None => Ok(ProfileValues::default()),
            }
        };
        let config_path = file("AWS_CONFIG_FILE", "config");
        let credentials_path = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_file = read(&config_path, FileKind::Config)?;
        let credentials_file = read(&credentials_path, FileKind::Credentials)?;
        if named_profile.is_some() && !config_file.found && !credentials_file.found {
            let shown = |p: &Option<PathBuf>| {
                p.as_ref()
                    .map_or("(no file)".to_string(), |p| p.display().to_string())
            };
            return Err(StoreError::Config {
                key: "AWS_PROFILE".to_string(),
                reason: format!(
                    "profile {profile} is in neither {} nor {}",
                    shown(&config_path),
                    shown(&credentials_path)
                ),
            });
        }

        let mut config = StoreConfig::default();
        if let Some(key_id) = var("AWS_ACCESS_KEY_ID") {
            let secret = var("AWS_SECRET_ACCESS_KEY").ok_or_else(|| StoreError::Config {
                key: "AWS_SECRET_ACCESS_KEY".to_string(),
                reason: "unset, while AWS_ACCESS_KEY_ID is set".to_string(),
            })?;
            config = config.with_credentials(&key_id, &secret, var("AWS_SESSION_TOKEN").as_deref());
            config.credentials_from = "environment";
        } else {
            for (values, path, from) in [
                (&credentials_file, &credentials_path, "credentials file"),
                (&config_file, &config_path, "config file"),
            ] {
                let Some(key_id) = &values.access_key_id else {
                    continue;
                };
                let secret = values.secret_access_key.clone().ok_or_else(|| StoreError::Config {
                    key: "aws_secret_access_key".to_string(),
                    reason: format!(
                        "profile {profile} in {} sets aws_access_key_id but not aws_secret_access_key",
                        path.as_deref().map_or(String::new(), |p| p.display().to_string())
                    ),
                })?;
                config.access_key_id = Some(key_id.clone());
                config.secret_access_key = Some(secret);
                config.session_token = values.session_token.clone();
                config.credentials_from = from;
                break;
            }
        }
        if let Some(region) = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| config_file.region.clone())
            .or_else(|| credentials_file.region.clone())
        {
            config.region = region;
        }
        config.endpoint = var("AWS_ENDPOINT_URL_S3")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .or_else(|| config_file.s3_endpoint_url.clone())
            .or_else(|| config_file.endpoint_url.clone())
            .map(|e| e.trim_end_matches('/').to_string());
        Ok(config)
    }

    /// The endpoint, `http://` or `https://`; plain HTTP is allowed (loopback servers, a
    /// proxy on the same host).
    pub fn with_endpoint(mut self, url: &str) -> Self {
        self.endpoint = Some(url.trim_end_matches('/').to_string());
        self
    }

    /// Static credentials.
    pub fn with_credentials(mut self, key_id: &str, secret: &str, token: Option<&str>) -> Self {
        self.access_key_id = Some(key_id.to_string());
        self.secret_access_key = Some(Secret::new(secret));
        self.session_token = token.map(Secret::new);
        self.credentials_from = "given";
        self
    }

    /// The region requests are signed for.
    pub fn with_region(mut self, region: &str) -> Self {
        self.region = region.to_string();
        self
    }

    /// Total time for one request, its retries included (default 60 s); past it the request
    /// fails with [`StoreError::Deadline`].
    pub fn with_request_deadline(mut self, d: Duration) -> Self {
        self.request_deadline = d;
        self
    }

    /// Longest wait for the next bytes of a response (default 10 s): a response stalled
    /// longer is cut and asked again from the bytes received.
    pub fn with_stall_timeout(mut self, d: Duration) -> Self {
        self.stall_timeout = d;
        self
    }

    /// Keys asked per LIST page (default and most 1000).
    pub fn with_list_page_keys(mut self, keys: usize) -> Self {
        self.list_page_keys = keys;
        self
    }

    /// Most objects one listing may return (default 10 million): a larger one is an error.
    pub fn with_list_objects_max(mut self, objects: usize) -> Self {
        self.list_objects_max = objects;
        self
    }

    /// How a session's reads share GETs (defaults [`DEFAULT_COALESCE_GAP_BYTES`] and
    /// [`DEFAULT_COALESCE_SPAN_BYTES`]). Reads of one object queued between two sends of a
    /// [`StoreSession`](crate::StoreSession) (with the same `If-Match`, none of them a whole
    /// object) are served by one GET when each starts at most `gap_bytes` past the end of the
    /// ones before it and the GET spans at most `span_bytes`; the bytes of the gaps are fetched
    /// and dropped. `span_bytes` 0 turns coalescing off: one GET per read.
    pub fn with_coalescing(mut self, gap_bytes: u64, span_bytes: u64) -> Self {
        self.coalescing = Coalescing {
            gap_bytes,
            span_bytes,
        };
        self
    }

    /// Largest gap one coalesced GET bridges: see [`StoreConfig::with_coalescing`].
    pub fn coalesce_gap_bytes(&self) -> u64 {
        self.coalescing.gap_bytes
    }

    /// Largest span of one coalesced GET, 0 for none: see [`StoreConfig::with_coalescing`].
    pub fn coalesce_span_bytes(&self) -> u64 {
        self.coalescing.span_bytes
    }

    /// The endpoint, if one is set.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The request deadline.
    pub fn request_deadline(&self) -> Duration {
        self.request_deadline
    }

    /// Checks what a store needs before it starts, naming the setting.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        let bad = |key: &str, reason: String| {
            Err(StoreError::Config {
                key: key.to_string(),
                reason,
            })
        };
        if let Some(e) = &self.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://"))
                || e.len() <= "https://".len()
            {
                return bad(
                    "endpoint",
                    format!("{e:?} is not an http:// or https:// URL"),
                );
            }
        }
        if self.region.is_empty() {
            return bad("region", "empty".to_string());
        }
        if self.request_deadline.is_zero() {
            return bad("request_deadline", "zero".to_string());
        }
        if self.stall_timeout.is_zero() {
            return bad("stall_timeout", "zero".to_string());
        }
        if !(1..=DEFAULT_LIST_PAGE_KEYS).contains(&self.list_page_keys) {
            return bad(
                "list_page_keys",
                format!("{} is not in 1..=1000", self.list_page_keys),
            );
        }
        Ok(())
    }
}

/// How adjacent reads of one object share a GET: see [`StoreConfig::with_coalescing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Coalescing {
    pub(crate) gap_bytes: u64,
    /// 0: off.
    pub(crate) span_bytes: u64,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars<'a>(table: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        let map: HashMap<&str, &str> = table.iter().copied().collect();
        move |k| map.get(k).map(|v| v.to_string())
    }

    fn home_with(config: &str, credentials: &str) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(home.path().join(".aws/config"), config).unwrap();
        std::fs::write(home.path().join(".aws/credentials"), credentials).unwrap();
        home
    }

    const CONFIG: &str = "[default]\nregion = eu-west-1\nendpoint_url = http://files:1\n\
        [profile dev]\nregion = us-east-2\ns3 =\n  endpoint_url = http://dev-s3:2\n";
    const CREDENTIALS: &str = "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = SFILE\n\
        [dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = SDEV\naws_session_token = TDEV\n";

    #[test]
    fn profile_files_give_credentials_region_and_endpoint() {
        let home = home_with(CONFIG, CREDENTIALS);
        let c = StoreConfig::from_vars(vars(&[]), Some(home.path())).unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKIDFILE"));
        assert_eq!(
            c.secret_access_key.as_ref().map(Secret::expose),
            Some("SFILE")
        );
        assert_eq!(c.region(), "eu-west-1");
        assert_eq!(c.endpoint(), Some("http://files:1"));
        let dev =
            StoreConfig::from_vars(vars(&[("AWS_PROFILE", "dev")]), Some(home.path())).unwrap();
        assert_eq!(dev.access_key_id.as_deref(), Some("AKIDDEV"));
        assert_eq!(dev.session_token.as_ref().map(Secret::expose), Some("TDEV"));
        assert_eq!(dev.region(), "us-east-2");
        assert_eq!(dev.endpoint(), Some("http://dev-s3:2"));
    }

    #[test]
    fn the_environment_wins_over_the_files() {
        let home = home_with(CONFIG, CREDENTIALS);
        let env = [
            ("AWS_ACCESS_KEY_ID", "AKIDENV"),
            ("AWS_SECRET_ACCESS_KEY", "SENV"),
            ("AWS_DEFAULT_REGION", "ap-east-1"),
            ("AWS_ENDPOINT_URL", "http://env:3/"),
            ("AWS_PROFILE", "dev"),
        ];
        let c = StoreConfig::from_vars(vars(&env), Some(home.path())).unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKIDENV"));
        assert_eq!(
            c.secret_access_key.as_ref().map(Secret::expose),
            Some("SENV")
        );
        // Credentials are a set: the file's token does not join the environment's keys.
        assert_eq!(c.session_token, None);
        assert_eq!(c.region(), "ap-east-1");
        assert_eq!(c.endpoint(), Some("http://env:3"));
        let more = [
            env.as_slice(),
            &[
                ("AWS_REGION", "sa-east-1"),
                ("AWS_ENDPOINT_URL_S3", "http://s3env:4"),
            ],
        ]
        .concat();
        let c = StoreConfig::from_vars(vars(&more), Some(home.path())).unwrap();
        assert_eq!(c.region(), "sa-east-1");
        assert_eq!(c.endpoint(), Some("http://s3env:4"));
        // An empty variable is unset.
        let c = StoreConfig::from_vars(vars(&[("AWS_REGION", "")]), Some(home.path())).unwrap();
        assert_eq!(c.region(), "eu-west-1");
    }

    #[test]
    fn explicit_files_replace_the_home_ones_and_no_home_is_no_files() {
        let home = home_with(CONFIG, CREDENTIALS);
        let other = tempfile::tempdir().unwrap();
        let creds = other.path().join("creds");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = AKIDOTHER\naws_secret_access_key = S\n",
        )
        .unwrap();
        let c = StoreConfig::from_vars(
            vars(&[("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap())]),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKIDOTHER"));
        assert_eq!(c.region(), "eu-west-1");
        let c = StoreConfig::from_vars(vars(&[]), None).unwrap();
        assert_eq!(
            (c.access_key_id.as_deref(), c.region(), c.endpoint()),
            (None, DEFAULT_REGION, None)
        );
    }

    #[test]
    fn half_credentials_and_unknown_profiles_are_named() {
        let home = home_with(CONFIG, CREDENTIALS);
        let e = StoreConfig::from_vars(vars(&[("AWS_ACCESS_KEY_ID", "A")]), Some(home.path()))
            .unwrap_err();
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY: unset"),
            "{e}"
        );
        let e = StoreConfig::from_vars(vars(&[("AWS_PROFILE", "nope")]), Some(home.path()))
            .unwrap_err();
        assert!(e.to_string().contains("profile nope is in neither"), "{e}");
        assert!(e.to_string().contains(".aws/credentials"), "{e}");
        let half = home_with("", "[default]\naws_access_key_id = A\n");
        let e = StoreConfig::from_vars(vars(&[]), Some(half.path())).unwrap_err();
        assert!(
            e.to_string()
                .contains("sets aws_access_key_id but not aws_secret_access_key"),
            "{e}"
        );
    }

    #[test]
    fn check_names_the_setting_that_is_wrong() {
        let e = StoreConfig::default()
            .with_endpoint("ftp://x")
            .check()
            .unwrap_err();
        assert!(e.to_string().starts_with("store setting endpoint:"), "{e}");
        let e = StoreConfig::default()
            .with_list_page_keys(0)
            .check()
            .unwrap_err();
        assert!(
            e.to_string().starts_with("store setting list_page_keys:"),
            "{e}"
        );
        let e = StoreConfig::default()
            .with_request_deadline(Duration::ZERO)
            .check()
            .unwrap_err();
        assert!(
            e.to_string().starts_with("store setting request_deadline:"),
            "{e}"
        );
        assert!(StoreConfig::default()
            .with_endpoint("http://127.0.0.1:9000/")
            .check()
            .is_ok());
    }

    #[test]
    fn coalescing_has_defaults_a_builder_and_shows_in_debug() {
        let c = StoreConfig::default();
        assert_eq!(c.coalesce_gap_bytes(), 256 << 10);
        assert_eq!(c.coalesce_span_bytes(), 8 << 20);
        let shown = format!("{c:?}");
        assert!(
            shown.contains("coalesce_gap_bytes: 262144, coalesce_span_bytes: 8388608"),
            "{shown}"
        );
        let off = c.with_coalescing(7, 0);
        assert_eq!(
            (off.coalesce_gap_bytes(), off.coalesce_span_bytes()),
            (7, 0)
        );
        assert!(format!("{off:?}").contains("coalesce_gap_bytes: 7, coalesce_span_bytes: 0"));
    }
}
