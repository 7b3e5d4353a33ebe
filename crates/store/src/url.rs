//! `s3://bucket/key` addresses.

use std::fmt;

use crate::error::StoreError;

/// An object or a prefix in a bucket: `s3://bucket/prefix/with/slashes`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreUrl {
    bucket: String,
    key: String,
}

impl StoreUrl {
    /// Parses `s3://bucket` or `s3://bucket/key`. The key is kept as written (an S3 key may
    /// hold any character, `//` and a trailing `/` included); the bucket follows S3's naming
    /// rules (3 to 63 of lowercase letters, digits, `.` and `-`).
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let bad = |reason| StoreError::Url {
            url: url.to_string(),
            reason,
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("does not start with s3://"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket(bucket).map_err(bad)?;
        Ok(StoreUrl {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// A URL from its parts; the bucket is checked as [`StoreUrl::parse`] does.
    pub fn new(bucket: &str, key: &str) -> Result<StoreUrl, StoreError> {
        check_bucket(bucket).map_err(|reason| StoreError::Url {
            url: format!("s3://{bucket}/{key}"),
            reason,
        })?;
        Ok(StoreUrl {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The key or prefix; `""` for the bucket's root.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The URL of `rest` under this one, with one `/` between them (none added after an empty
    /// key or one that already ends in `/`).
    pub fn join(&self, rest: &str) -> StoreUrl {
        let rest = rest.trim_start_matches('/');
        let key = if self.key.is_empty() || self.key.ends_with('/') {
            format!("{}{rest}", self.key)
        } else {
            format!("{}/{rest}", self.key)
        };
        StoreUrl {
            bucket: self.bucket.clone(),
            key,
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if !self.key.is_empty() {
            write!(f, "/{}", self.key)?;
        }
        Ok(())
    }
}

/// `s3://bucket/key` for an error message.
pub(crate) fn display(bucket: &str, key: &str) -> String {
    if key.is_empty() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{key}")
    }
}

fn check_bucket(bucket: &str) -> Result<(), &'static str> {
    if bucket.is_empty() {
        return Err("no bucket name after s3://");
    }
    if bucket.len() < 3 || bucket.len() > 63 {
        return Err("a bucket name has 3 to 63 characters");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("a bucket name has only lowercase letters, digits, '.' and '-'");
    }
    let ends = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !ends(bucket.as_bytes()[0]) || !ends(bucket.as_bytes()[bucket.len() - 1]) {
        return Err("a bucket name starts and ends with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_and_key_and_prints_them_back() {
        let u = StoreUrl::parse("s3://my-bucket/train/shard-000.tar").unwrap();
        assert_eq!((u.bucket(), u.key()), ("my-bucket", "train/shard-000.tar"));
        assert_eq!(u.to_string(), "s3://my-bucket/train/shard-000.tar");
        let root = StoreUrl::parse("s3://my-bucket").unwrap();
        assert_eq!((root.bucket(), root.key()), ("my-bucket", ""));
        assert_eq!(root.to_string(), "s3://my-bucket");
        assert_eq!(StoreUrl::parse("s3://my-bucket/").unwrap().key(), "");
        assert_eq!(StoreUrl::parse("s3://b.c-1/a//b/").unwrap().key(), "a//b/");
    }

    #[test]
    fn refuses_what_is_not_an_s3_url_naming_why() {
        for (url, why) in [
            ("http://bucket/key", "does not start with s3://"),
            ("s3://", "no bucket name"),
            ("s3:///key", "no bucket name"),
            ("s3://ab/key", "3 to 63"),
            ("s3://My_Bucket/key", "lowercase"),
            ("s3://-bucket/key", "starts and ends"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert!(e.to_string().contains(why), "{url}: {e}");
            assert!(e.to_string().contains(url), "{url}: {e}");
        }
    }

    #[test]
    fn join_puts_one_slash_between_prefix_and_rest() {
        let root = StoreUrl::parse("s3://bkt").unwrap();
        assert_eq!(root.join("a/b").to_string(), "s3://bkt/a/b");
        let p = StoreUrl::parse("s3://bkt/train").unwrap();
        assert_eq!(p.join("x.tar").key(), "train/x.tar");
        assert_eq!(p.join("/x.tar").key(), "train/x.tar");
        let d = StoreUrl::parse("s3://bkt/train/").unwrap();
        assert_eq!(d.join("x.tar").key(), "train/x.tar");
    }
}
