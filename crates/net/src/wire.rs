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

/// Checker run by the wire fuzz target (and the seeded test below): arbitrary bytes as a
/// request and as a reply never panic, what decodes holds at most [`BATCH_MAX`] entries and
/// no more bytes than came, and re-encodes to the very bytes; a request and a reply built
/// from the bytes round-trip.
#[cfg(any(test, fuzzing))]
pub fn fuzz_check(data: &[u8]) {
    if let Ok((id, samples)) = decode_request(data) {
        assert!(samples.len() <= BATCH_MAX);
        assert_eq!(
            encode_request(id, &samples),
            data,
            "a request re-encodes as it came"
        );
    }
    if let Ok((id, answers)) = decode_reply(Bytes::copy_from_slice(data)) {
        assert!(answers.len() <= BATCH_MAX);
        let held: usize = answers.iter().flatten().map(Bytes::len).sum();
        assert!(
            held <= data.len()
                && answers
                    .iter()
                    .flatten()
                    .all(|a| a.len() <= SAMPLE_MAX_BYTES)
        );
        assert_eq!(
            encode_reply(id, &answers),
            data,
            "a reply re-encodes as it came"
        );
    }
    // Messages made from the bytes: the first 8 the id, the 9th the entry count, the rest
    // the samples of a request, and the answers' lengths (a miss every fourth) and bytes.
    let id = u64::from_le_bytes(std::array::from_fn(|i| data.get(i).copied().unwrap_or(0)));
    let count = usize::from(data.get(8).copied().unwrap_or(0)) % (BATCH_MAX + 1);
    let rest = data.get(9..).unwrap_or_default();
    let samples: Vec<u32> = rest
        .chunks_exact(4)
        .take(count)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    assert_eq!(
        decode_request(&encode_request(id, &samples)),
        Ok((id, samples))
    );
    let mut answers = Vec::with_capacity(count);
    let mut left = rest;
    for (k, &len) in rest.iter().take(count).enumerate() {
        if k % 4 == 3 {
            answers.push(None);
            continue;
        }
        let take = usize::from(len).min(left.len());
        answers.push(Some(Bytes::copy_from_slice(&left[..take])));
        left = &left[take..];
    }
    let reply = Bytes::from(encode_reply(id, &answers));
    assert_eq!(decode_reply(reply), Ok((id, answers)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: seeded inputs with no dependency.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn seeded_random_messages_never_panic_and_round_trip() {
        let mut s = 0x3172_E5ED_u64;
        for i in 0..5000 {
            let len = (next(&mut s) % 160) as usize;
            let mut data: Vec<u8> = (0..len).map(|_| next(&mut s) as u8).collect();
            // Most random counts are past a batch: keep some within it, and some messages
            // made right with one byte changed.
            if i % 3 == 0 && data.len() >= 12 {
                data[8..12].copy_from_slice(&((next(&mut s) % 5) as u32).to_le_bytes());
            }
            if i % 5 == 0 {
                let answers: Vec<Option<Bytes>> = (0..next(&mut s) % 4)
                    .map(|k| (k % 2 == 0).then(|| Bytes::from(vec![k as u8; k as usize])))
                    .collect();
                data = encode_reply(i, &answers);
                if let Some(b) = data.get_mut((next(&mut s) % 32) as usize) {
                    *b ^= 1 << (next(&mut s) % 8);
                }
            }
            fuzz_check(&data);
        }
    }

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
