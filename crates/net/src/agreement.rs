//! The start-up check that every node plans from the same inputs: one allgather of a 64-bit
//! digest, and only when digests differ a second exchange of the fields themselves, to name
//! what differs.

use crate::error::NetError;

/// The plan's inputs, as (field, value) pairs in a fixed order.
pub type Fields = Vec<(String, String)>;

/// What one node brings to the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agreement {
    fields: Fields,
}

/// Longest encoded field list: far above any plan's inputs, low enough that a garbled
/// length cannot ask for gigabytes.
pub(crate) const ENCODED_MAX_BYTES: usize = 1 << 20;

impl Agreement {
    pub fn new(fields: Fields) -> Agreement {
        Agreement { fields }
    }

    pub fn fields(&self) -> &Fields {
        &self.fields
    }

    /// FNV-1a over the encoding: equal fields, equal digests, on every node and build.
    pub fn digest(&self) -> u64 {
        self.encode().iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    /// Each string as its length (u32, little-endian) then its bytes, field then value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in &self.fields {
            for s in [k, v] {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
        out
    }

    /// Reads [`Agreement::encode`]'s bytes of node `node`.
    ///
    /// # Errors
    /// Bytes cut short, a string not UTF-8, or an odd number of strings.
    pub fn decode(node: usize, mut bytes: &[u8]) -> Result<Agreement, NetError> {
        let garbled = |reason: &str| NetError::Garbled {
            node,
            reason: reason.to_owned(),
        };
        if bytes.len() > ENCODED_MAX_BYTES {
            return Err(garbled("longer than any plan's inputs"));
        }
        let mut strings = Vec::new();
        while !bytes.is_empty() {
            let (len, rest) = bytes
                .split_first_chunk::<4>()
                .ok_or_else(|| garbled("a length cut short"))?;
            let len = u32::from_le_bytes(*len) as usize;
            if rest.len() < len {
                return Err(garbled("a string cut short"));
            }
            let (s, rest) = rest.split_at(len);
            strings.push(String::from_utf8(s.to_vec()).map_err(|_| garbled("a string not UTF-8"))?);
            bytes = rest;
        }
        if strings.len() % 2 != 0 {
            return Err(garbled("a field without its value"));
        }
        let mut it = strings.into_iter();
        let mut fields = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            fields.push((k, v));
        }
        Ok(Agreement { fields })
    }

    /// Compares every node's fields with node 0's: the first node, then the first field,
    /// that differs.
    ///
    /// # Errors
    /// [`NetError::Disagree`] naming the node, the field and both values.
    pub fn check(all: &[Agreement]) -> Result<(), NetError> {
        let Some(first) = all.first() else {
            return Ok(());
        };
        for (node, other) in all.iter().enumerate().skip(1) {
            let n = first.fields.len().max(other.fields.len());
            for i in 0..n {
                let ours = first.fields.get(i);
                let theirs = other.fields.get(i);
                if ours == theirs {
                    continue;
                }
                let name = |f: Option<&(String, String)>| f.map(|(k, _)| k.clone());
                let value = |f: Option<&(String, String)>| {
                    f.map_or_else(|| "(absent)".to_owned(), |(_, v)| v.clone())
                };
                let field = match (name(ours), name(theirs)) {
                    (Some(a), Some(b)) if a != b => format!("field {i} ({a} or {b})"),
                    (Some(a), _) | (None, Some(a)) => a,
                    (None, None) => unreachable!("one side has field {i}"),
                };
                let (ours, theirs) = match (ours, theirs) {
                    (Some(a), Some(b)) if a.0 != b.0 => {
                        (format!("{}={}", a.0, a.1), format!("{}={}", b.0, b.1))
                    }
                    _ => (value(ours), value(theirs)),
                };
                return Err(NetError::Disagree {
                    node,
                    field,
                    ours,
                    theirs,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(seed: &str) -> Agreement {
        Agreement::new(vec![
            ("seed".into(), seed.into()),
            ("samples".into(), "1000".into()),
            ("policy".into(), "Reuse 4096".into()),
        ])
    }

    #[test]
    fn equal_inputs_agree_and_digest_alike() {
        let all = vec![fields("7"), fields("7"), fields("7")];
        assert_eq!(Agreement::check(&all), Ok(()));
        assert_eq!(all[0].digest(), all[2].digest());
        assert_ne!(fields("7").digest(), fields("8").digest());
    }

    #[test]
    fn the_first_node_and_field_that_differ_are_named_with_both_values() {
        let all = vec![fields("7"), fields("7"), fields("8"), fields("9")];
        let e = Agreement::check(&all).unwrap_err();
        assert_eq!(
            e,
            NetError::Disagree {
                node: 2,
                field: "seed".into(),
                ours: "7".into(),
                theirs: "8".into(),
            }
        );
        assert!(e
            .to_string()
            .contains("node 2 was started with seed = \"8\""));
        let mut short = fields("7");
        short.fields.pop();
        let e = Agreement::check(&[fields("7"), short]).unwrap_err();
        assert!(
            matches!(e, NetError::Disagree { node: 1, ref field, ref theirs, .. }
            if field == "policy" && theirs == "(absent)")
        );
    }

    #[test]
    fn encoding_round_trips_and_garbage_is_refused_naming_the_node() {
        let a = fields("7");
        assert_eq!(Agreement::decode(0, &a.encode()), Ok(a.clone()));
        let bytes = a.encode();
        for cut in [1, 5, bytes.len() - 1] {
            let e = Agreement::decode(3, &bytes[..cut]).unwrap_err();
            assert!(matches!(e, NetError::Garbled { node: 3, .. }), "{e}");
        }
        let mut odd = bytes.clone();
        odd.extend_from_slice(&1u32.to_le_bytes());
        odd.push(b'x');
        assert!(Agreement::decode(1, &odd)
            .unwrap_err()
            .to_string()
            .contains("without its value"));
        assert!(Agreement::decode(0, &[0xff; 8]).is_err());
    }
}
