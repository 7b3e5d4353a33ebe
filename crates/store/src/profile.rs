//! The AWS shared config and credentials files (`~/.aws/config`, `~/.aws/credentials`).
//!
//! object_store reads only environment variables, so the files are parsed here: static
//! credentials, region and endpoint of one profile. The ways of getting credentials that need
//! more than the file (SSO, a credential process, an assumed role) are refused by name rather
//! than silently skipped, so a user is not left with the wrong identity.

use std::path::Path;

use crate::error::StoreError;
use crate::secret::Secret;

/// The most a profile file may hold: a real one is a few KiB.
pub(crate) const PROFILE_FILE_MAX_BYTES: u64 = 1 << 20;

/// Which of the two files: they name their sections differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// `~/.aws/config`: `[default]` and `[profile NAME]`.
    Config,
    /// `~/.aws/credentials`: `[NAME]`.
    Credentials,
}

/// What one profile of one file sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProfileValues {
    /// Whether the file has the profile's section at all.
    pub(crate) found: bool,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<Secret>,
    pub(crate) session_token: Option<Secret>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint_url: Option<String>,
    /// `endpoint_url` under `s3 =`: it wins over the profile's own.
    pub(crate) s3_endpoint_url: Option<String>,
}

/// Keys naming ways of getting credentials that this crate does not follow.
const UNSUPPORTED: &[&str] = &[
    "credential_process",
    "role_arn",
    "source_profile",
    "credential_source",
    "web_identity_token_file",
    "sso_session",
];

/// Reads `profile` from `path`; `None` when the file does not exist.
pub(crate) fn read(
    path: &Path,
    kind: FileKind,
    profile: &str,
) -> Result<Option<ProfileValues>, StoreError> {
    let whole = |reason: String| StoreError::Profile {
        file: path.to_path_buf(),
        line: 0,
        reason,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(whole(format!("cannot read it: {e}"))),
    };
    if meta.len() > PROFILE_FILE_MAX_BYTES {
        return Err(whole(format!(
            "{} bytes, more than the {PROFILE_FILE_MAX_BYTES} a profile file may have",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| whole(format!("cannot read it: {e}")))?;
    parse(&bytes, path, kind, profile).map(Some)
}

/// Parses `profile` out of a file's bytes. A profile that is not in the file gives empty
/// values; the whole file must be well formed all the same.
pub(crate) fn parse(
    bytes: &[u8],
    file: &Path,
    kind: FileKind,
    profile: &str,
) -> Result<ProfileValues, StoreError> {
    let err = |line: usize, reason: String| StoreError::Profile {
        file: file.to_path_buf(),
        line,
        reason,
    };
    if bytes.len() as u64 > PROFILE_FILE_MAX_BYTES {
        return Err(err(
            0,
            format!("more than the {PROFILE_FILE_MAX_BYTES} bytes a profile file may have"),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        err(line, "not UTF-8".to_string())
    })?;
    let mut values = ProfileValues::default();
    // Whether the current section is the profile asked for; None before the first section.
    let mut selected: Option<bool> = None;
    // The key whose value was empty (`s3 =`): indented lines below it are its sub-keys.
    let mut nested: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let indented = raw.starts_with([' ', '\t']);
        if let Some(header) = trimmed.strip_prefix('[') {
            let name = header
                .strip_suffix(']')
                .ok_or_else(|| err(line, "a section header without its closing ']'".to_string()))?
                .trim();
            let here = section_is(name, kind, profile);
            values.found |= here;
            selected = Some(here);
            nested = None;
            continue;
        }
        let (key, value) = trimmed
            .split_once('=')
            .ok_or_else(|| err(line, "expected 'key = value' or '[section]'".to_string()))?;
        let (key, value) = (key.trim(), strip_comment(value).trim());
        if key.is_empty() {
            return Err(err(line, "a line with no key before '='".to_string()));
        }
        let Some(here) = selected else {
            return Err(err(line, format!("key {key} before the first [section]")));
        };
        if indented && nested.is_some() {
            // A sub-key of `s3 =`: only its endpoint_url is used.
            if here && nested.as_deref() == Some("s3") && key == "endpoint_url" {
                values.s3_endpoint_url = Some(value.to_string());
            }
            continue;
        }
        nested = value.is_empty().then(|| key.to_string());
        if !here {
            continue;
        }
        let refuse = UNSUPPORTED.contains(&key) || key.starts_with("sso_");
        if refuse {
            return Err(err(
                line,
                format!(
                    "profile {profile} sets {key}: only static credentials (aws_access_key_id, \
                     aws_secret_access_key, aws_session_token) are supported; set them, or the \
                     AWS_* environment variables"
                ),
            ));
        }
        match key {
            "aws_access_key_id" => values.access_key_id = Some(value.to_string()),
            "aws_secret_access_key" => values.secret_access_key = Some(Secret::new(value)),
            "aws_session_token" => values.session_token = Some(Secret::new(value)),
            "region" => values.region = Some(value.to_string()),
            "endpoint_url" if !value.is_empty() => values.endpoint_url = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(values)
}

fn section_is(name: &str, kind: FileKind, profile: &str) -> bool {
    match kind {
        FileKind::Credentials => name == profile,
        FileKind::Config => match name.strip_prefix("profile") {
            Some(rest) if rest.starts_with([' ', '\t']) => rest.trim() == profile,
            _ => name == "default" && profile == "default",
        },
    }
}

/// A comment after a value starts at ` #` or ` ;`, as the AWS CLI reads it.
fn strip_comment(value: &str) -> &str {
    let cut = value
        .char_indices()
        .find(|&(i, c)| (c == '#' || c == ';') && value[..i].ends_with([' ', '\t']))
        .map_or(value.len(), |(i, _)| i);
    &value[..cut]
}

/// Checker run by the `aws_profile` fuzz target and the unit tests: arbitrary bytes as both
/// files, for two profiles. Parsing never panics, is deterministic, names the file in every
/// error, and gives values of one line each with no surrounding blanks.
#[cfg(any(test, fuzzing))]
pub(crate) fn check_profile_bytes(data: &[u8]) {
    let file = Path::new("fuzz/aws-config");
    for kind in [FileKind::Config, FileKind::Credentials] {
        for profile in ["default", "dev"] {
            let first = parse(data, file, kind, profile);
            let again = parse(data, file, kind, profile);
            match (&first, &again) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b);
                    let texts = [
                        a.access_key_id.as_deref(),
                        a.secret_access_key.as_ref().map(Secret::expose),
                        a.session_token.as_ref().map(Secret::expose),
                        a.region.as_deref(),
                        a.endpoint_url.as_deref(),
                        a.s3_endpoint_url.as_deref(),
                    ];
                    for t in texts.into_iter().flatten() {
                        assert!(!t.contains('\n') && t.trim() == t, "{t:?}");
                    }
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a.to_string(), b.to_string());
                    assert!(a.to_string().starts_with("fuzz/aws-config"), "{a}");
                }
                _ => panic!("two parses of the same bytes disagree"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
# a comment
[default]
region = eu-west-1
output = json

[profile dev]
region = us-east-2 # trailing comment
endpoint_url = http://127.0.0.1:9000
aws_access_key_id = AKIDDEV

[profile nested]
s3 =
    endpoint_url = http://10.0.0.1:9000
    addressing_style = path
region = ap-south-1

[profile sso]
sso_start_url = https://example.invalid/start

[profile role]
role_arn = arn:aws:iam::123:role/x
source_profile = default
";

    const CREDENTIALS: &str = "\
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = SECRETDEFAULT

[dev]
aws_access_key_id=AKIDDEV2
aws_secret_access_key=SECRETDEV
aws_session_token=TOKENDEV
";

    fn config(profile: &str) -> Result<ProfileValues, StoreError> {
        parse(
            CONFIG.as_bytes(),
            Path::new("/h/.aws/config"),
            FileKind::Config,
            profile,
        )
    }

    fn credentials(profile: &str) -> Result<ProfileValues, StoreError> {
        parse(
            CREDENTIALS.as_bytes(),
            Path::new("/h/.aws/credentials"),
            FileKind::Credentials,
            profile,
        )
    }

    #[test]
    fn reads_the_profile_asked_for_from_each_file() {
        let d = config("default").unwrap();
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert_eq!(d.endpoint_url, None);
        let dev = config("dev").unwrap();
        assert_eq!(dev.region.as_deref(), Some("us-east-2"));
        assert_eq!(dev.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(dev.access_key_id.as_deref(), Some("AKIDDEV"));
        let c = credentials("dev").unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKIDDEV2"));
        assert_eq!(
            c.secret_access_key.as_ref().map(Secret::expose),
            Some("SECRETDEV")
        );
        assert_eq!(
            c.session_token.as_ref().map(Secret::expose),
            Some("TOKENDEV")
        );
        let c = credentials("default").unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKIDDEFAULT"));
        assert_eq!(c.session_token, None);
        assert!(c.found);
        // A profile absent from the file sets nothing.
        assert_eq!(credentials("nested").unwrap(), ProfileValues::default());
        assert!(!credentials("nested").unwrap().found);
    }

    #[test]
    fn the_s3_sub_section_gives_the_endpoint() {
        let n = config("nested").unwrap();
        assert_eq!(n.s3_endpoint_url.as_deref(), Some("http://10.0.0.1:9000"));
        assert_eq!(n.endpoint_url, None);
        assert_eq!(n.region.as_deref(), Some("ap-south-1"));
    }

    #[test]
    fn a_credentials_section_is_not_a_config_profile_section() {
        // In the credentials file `[profile dev]` is a profile named "profile dev".
        let text = b"[profile dev]\naws_access_key_id = X\n";
        let p = parse(text, Path::new("c"), FileKind::Credentials, "dev").unwrap();
        assert_eq!(p.access_key_id, None);
        // In the config file `[dev]` is not the profile dev.
        let text = b"[dev]\nregion = r\n";
        let p = parse(text, Path::new("c"), FileKind::Config, "dev").unwrap();
        assert_eq!(p.region, None);
    }

    #[test]
    fn unsupported_ways_are_refused_naming_profile_key_file_and_line() {
        let e = config("sso").unwrap_err().to_string();
        assert!(
            e.starts_with("/h/.aws/config:18: profile sso sets sso_start_url"),
            "{e}"
        );
        let e = config("role").unwrap_err().to_string();
        assert!(
            e.starts_with("/h/.aws/config:21: profile role sets role_arn"),
            "{e}"
        );
        // Only in the profile asked for.
        assert!(config("dev").is_ok());
    }

    #[test]
    fn malformed_lines_are_named_by_file_and_line() {
        let file = Path::new("/h/cfg");
        for (text, line, why) in [
            ("[default\nregion = x\n", 1, "closing ']'"),
            ("[default]\nregion x\n", 2, "expected 'key = value'"),
            ("region = x\n", 1, "before the first [section]"),
            ("[default]\n\n = x\n", 3, "no key"),
        ] {
            let e = parse(text.as_bytes(), file, FileKind::Config, "default").unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("/h/cfg:{line}: ")),
                "{e}"
            );
            assert!(e.to_string().contains(why), "{e}");
        }
        let e = parse(
            b"[default]\nregion = \xff\n",
            file,
            FileKind::Config,
            "default",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "/h/cfg:2: not UTF-8");
    }

    #[test]
    fn files_over_the_bound_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let big = vec![b'#'; PROFILE_FILE_MAX_BYTES as usize + 1];
        std::fs::write(&path, &big).unwrap();
        let e = read(&path, FileKind::Config, "default")
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than the 1048576"), "{e}");
        assert_eq!(
            read(&dir.path().join("none"), FileKind::Config, "default").unwrap(),
            None
        );
    }

    #[test]
    fn the_fuzz_checker_holds_on_the_examples_and_on_junk() {
        check_profile_bytes(CONFIG.as_bytes());
        check_profile_bytes(CREDENTIALS.as_bytes());
        for junk in [
            &b"["[..],
            b"=",
            b"[default]\n  x = y\n=\n",
            b"[default]\ns3 =\n\tendpoint_url=;\n",
            b"\xff",
        ] {
            check_profile_bytes(junk);
        }
    }
}
