//! The messages between nodes' transports: a batch of fetches to one peer, and the peer's
//! batch of answers. Little-endian, length-checked; a message that does not decode is
//! refused, never trusted.
//!
//! Request: `id u64, count u32, count x sample u32`.
//! Reply: `id u64, count u32, count x (length + 1) u32 (0: miss), then the bytes in order`.

use bytes::Bytes;

/// Fetches in one request message at most.
pub const BATCH_MAX: usize = 64;
/// Bytes of one answered sample at most: a reply is at most `BATCH_MAX` of them.
pub const SAMPLE_MAX_BYTES: usize = (1 << 30) - 1;

/// Encodes a request for `samples` (at most [`BATCH_MAX`]).
pub fn encode_request(id: u64, samples: &[u32]) -> Vec<u8> {
    debug_assert!(samples.len() <= BATCH_MAX);
    let mut out = Vec::with_capacity(12 + 4 * samples.len());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(samples.len() as u32).to_le_bytes());
    for s in samples {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// Decodes a request: its id and samples.
pub fn decode_request(bytes: &[u8]) -> Result<(u64, Vec<u32>), String> {
    let (id, count, rest) = header(bytes)?;
    if rest.len() != 4 * count {
        return Err(format!("{count} samples in {} bytes", rest.len()));
    }
    let samples = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok((id, samples))
}

/// Encodes the answers to request `id`, in its order (`None`: a miss).
pub fn encode_reply(id: u64, answers: &[Option<Bytes>]) -> Vec<u8> {
    let data: usize = answers.iter().flatten().map(Bytes::len).sum();
    let mut out = Vec::with_capacity(12 + 4 * answers.len() + data);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(answers.len() as u32).to_le_bytes());
    for a in answers {
        let tag = a.as_ref().map_or(0, |b| b.len() as u32 + 1);
        out.extend_from_slice(&tag.to_le_bytes());
    }
    for b in answers.iter().flatten() {
        out.extend_from_slice(b);
    }
    out
}

/// Decodes a reply: its id and answers, each a slice of `bytes` (shared, not copied).
pub fn decode_reply(bytes: Bytes) -> Result<(u64, Vec<Option<Bytes>>), String> {
    let (id, count, rest) = header(&bytes)?;
    let lens_end = 4 * count;
    if rest.len() < lens_end {
        return Err(format!("{count} answers in {} bytes", rest.len()));
    }
    let mut at = 12 + lens_end;
    let mut answers = Vec::with_capacity(count);
    for c in rest[..lens_end].chunks_exact(4) {
        let tag = u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize;
        if tag == 0 {
            answers.push(None);
            continue;
        }
        let len = tag - 1;
        if len > SAMPLE_MAX_BYTES || at + len > bytes.len() {
            return Err(format!("an answer of {len} bytes past the message's end"));
        }
        answers.push(Some(bytes.slice(at..at + len)));
        at += len;
    }
    if at != bytes.len() {
        return Err(format!("{} bytes after the last answer", bytes.len() - at));
    }
    Ok((id, answers))
}

fn header(bytes: &[u8]) -> Result<(u64, usize, &[u8]), String> {
    if bytes.len() < 12 {
        return Err(format!("{} bytes: shorter than a header", bytes.len()));
    }
    let id = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let count = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    if count > BATCH_MAX {
        return Err(format!("{count} entries: more than a batch holds"));
    }
    Ok((id, count, &bytes[12..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let r = encode_request(7, &[3, 1, 4]);
        assert_eq!(decode_request(&r).unwrap(), (7, vec![3, 1, 4]));
        let answers = vec![Some(Bytes::from_static(b"abc")), None, Some(Bytes::new())];
        let got = decode_reply(Bytes::from(encode_reply(9, &answers))).unwrap();
        assert_eq!(got, (9, answers));
    }

    #[test]
    fn every_truncation_and_corruption_is_refused_not_trusted() {
        let r = encode_request(1, &[5, 6]);
        for cut in 0..r.len() {
            assert!(decode_request(&r[..cut]).is_err(), "request cut at {cut}");
        }
        let reply = encode_reply(2, &[Some(Bytes::from_static(b"hello")), None]);
        for cut in 0..reply.len() {
            assert!(
                decode_reply(Bytes::copy_from_slice(&reply[..cut])).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = reply.clone();
        long.push(0);
        assert!(decode_reply(Bytes::from(long)).is_err());
        let mut huge = encode_request(1, &[]);
        huge[8..12].copy_from_slice(&(BATCH_MAX as u32 + 1).to_le_bytes());
        assert!(decode_request(&huge)
            .unwrap_err()
            .contains("more than a batch"));
        let mut lying = reply;
        lying[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_reply(Bytes::from(lying)).is_err());
    }
}
