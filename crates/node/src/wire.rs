//! The messages between a node's host and its rank processes: frames of a little-endian
//! length (`u32`) and a body whose first byte is the message's kind. Hand-written, so that a
//! batch's message costs a few hundred bytes and no allocation beyond its buffer.

use std::io::Read;

use crate::error::{Failure, NodeError};

/// The longest frame either side accepts: a batch of 65,536 samples fits.
pub(crate) const FRAME_MAX_BYTES: usize = 2 << 20;

/// One sample of a delivered batch: where its bytes are in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The sample's id in the dataset.
    pub id: u32,
    /// Its label.
    pub label: u32,
    /// Where its bytes start in the arena.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
}

/// What a rank says to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToHost {
    /// The first message: who the rank is and the configuration it was started with, as
    /// (field, value) pairs in a fixed order.
    Hello {
        local_rank: u32,
        pid: u32,
        config: Vec<(String, String)>,
    },
    /// The rank dropped the batch in `slot`: the host may fill it again.
    Release { slot: u32 },
    /// The rank asks for its next batch: the host takes it from the loader only now, so the
    /// loader sees each rank's demand as a rank thread would make it.
    Want,
}

/// What the host says to a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToRank {
    /// Attached; the arena's descriptor rides with this message.
    Welcome {
        pid: u32,
        arena_bytes: u64,
        slots: u32,
        /// The host loader's `Positions` as JSON: how the rank turns the batches it was
        /// given into its saved position.
        positions: String,
    },
    /// Not attached: the first configuration field that differs.
    Refused {
        field: String,
        host: String,
        rank: String,
    },
    /// A batch, in `slot` of the rank's slots.
    Batch {
        slot: u32,
        epoch: u32,
        iteration: u32,
        samples: Vec<Placed>,
        skipped: Vec<u32>,
    },
    /// The loader failed this rank's batch; the rank may go on (the host decides).
    Failed { kind: Failure, reason: String },
    /// The job cannot go on: `rank` went away (`None`: the loader stopped).
    Stop { rank: Option<u32>, reason: String },
    /// Every epoch delivered.
    End,
}

/// The error a [`ToRank::Stop`] names: the rank that went away, or the loader's failure.
pub(crate) fn stop_error(rank: Option<u32>, reason: String) -> NodeError {
    match rank {
        Some(rank) => NodeError::RankGone {
            rank: rank as usize,
            reason,
        },
        None => NodeError::Loader { reason },
    }
}

const HELLO: u8 = 1;
const RELEASE: u8 = 2;
const WANT: u8 = 3;
const WELCOME: u8 = 10;
const REFUSED: u8 = 11;
const BATCH: u8 = 12;
const FAILED: u8 = 13;
const STOP: u8 = 14;
const END: u8 = 15;

/// Appends to a frame under construction.
struct Out(Vec<u8>);

impl Out {
    fn new(kind: u8) -> Self {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[0, 0, 0, 0, kind]);
        Out(v)
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// The frame, its length filled in.
    fn done(mut self) -> Vec<u8> {
        let body = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&body.to_le_bytes());
        self.0
    }
}

/// Reads a frame's body.
struct In<'a>(&'a [u8]);

impl In<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], NodeError> {
        if self.0.len() < n {
            return Err(protocol("a message cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, NodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, NodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, NodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<String, NodeError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| protocol("a string not UTF-8"))
    }
    /// A count of items of at least `each` bytes, checked against what is left.
    fn count(&mut self, each: usize) -> Result<usize, NodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.0.len() {
            return Err(protocol("a count past the message's end"));
        }
        Ok(n)
    }
    fn end(self) -> Result<(), NodeError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(protocol("bytes after the message's end")),
        }
    }
}

fn protocol(reason: &str) -> NodeError {
    NodeError::Protocol {
        reason: reason.into(),
    }
}

impl ToHost {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            ToHost::Hello {
                local_rank,
                pid,
                config,
            } => {
                let mut o = Out::new(HELLO);
                o.u32(*local_rank).u32(*pid).u32(config.len() as u32);
                for (k, v) in config {
                    o.str(k).str(v);
                }
                o.done()
            }
            ToHost::Release { slot } => {
                let mut o = Out::new(RELEASE);
                o.u32(*slot);
                o.done()
            }
            ToHost::Want => Out::new(WANT).done(),
        }
    }

    pub(crate) fn decode(body: &[u8]) -> Result<Self, NodeError> {
        let (&kind, rest) = body
            .split_first()
            .ok_or_else(|| protocol("an empty message"))?;
        let mut i = In(rest);
        let m = match kind {
            HELLO => {
                let (local_rank, pid) = (i.u32()?, i.u32()?);
                let n = i.count(8)?;
                let mut config = Vec::with_capacity(n);
                for _ in 0..n {
                    config.push((i.str()?, i.str()?));
                }
                ToHost::Hello {
                    local_rank,
                    pid,
                    config,
                }
            }
            RELEASE => ToHost::Release { slot: i.u32()? },
            WANT => ToHost::Want,
            k => return Err(protocol(&format!("unknown message kind {k} to the host"))),
        };
        i.end()?;
        Ok(m)
    }
}

impl ToRank {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            ToRank::Welcome {
                pid,
                arena_bytes,
                slots,
                positions,
            } => {
                let mut o = Out::new(WELCOME);
                o.u32(*pid).u64(*arena_bytes).u32(*slots).str(positions);
                o.done()
            }
            ToRank::Refused { field, host, rank } => {
                let mut o = Out::new(REFUSED);
                o.str(field).str(host).str(rank);
                o.done()
            }
            ToRank::Batch {
                slot,
                epoch,
                iteration,
                samples,
                skipped,
            } => {
                let mut o = Out::new(BATCH);
                o.0.reserve(16 + 24 * samples.len() + 4 * skipped.len());
                o.u32(*slot).u32(*epoch).u32(*iteration);
                o.u32(samples.len() as u32);
                for s in samples {
                    o.u32(s.id).u32(s.label).u64(s.offset).u64(s.len);
                }
                o.u32(skipped.len() as u32);
                for &id in skipped {
                    o.u32(id);
                }
                o.done()
            }
            ToRank::Failed { kind, reason } => {
                let mut o = Out::new(FAILED);
                o.u8(kind.code()).str(reason);
                o.done()
            }
            ToRank::Stop { rank, reason } => {
                let mut o = Out::new(STOP);
                o.u32(rank.map_or(u32::MAX, |r| r)).str(reason);
                o.done()
            }
            ToRank::End => Out::new(END).done(),
        }
    }

    pub(crate) fn decode(body: &[u8]) -> Result<Self, NodeError> {
        let (&kind, rest) = body
            .split_first()
            .ok_or_else(|| protocol("an empty message"))?;
        let mut i = In(rest);
        let m = match kind {
            WELCOME => ToRank::Welcome {
                pid: i.u32()?,
                arena_bytes: i.u64()?,
                slots: i.u32()?,
                positions: i.str()?,
            },
            REFUSED => ToRank::Refused {
                field: i.str()?,
                host: i.str()?,
                rank: i.str()?,
            },
            BATCH => {
                let (slot, epoch, iteration) = (i.u32()?, i.u32()?, i.u32()?);
                let n = i.count(24)?;
                let mut samples = Vec::with_capacity(n);
                for _ in 0..n {
                    samples.push(Placed {
                        id: i.u32()?,
                        label: i.u32()?,
                        offset: i.u64()?,
                        len: i.u64()?,
                    });
                }
                let n = i.count(4)?;
                let skipped = (0..n).map(|_| i.u32()).collect::<Result<_, _>>()?;
                ToRank::Batch {
                    slot,
                    epoch,
                    iteration,
                    samples,
                    skipped,
                }
            }
            FAILED => ToRank::Failed {
                kind: Failure::from_code(i.u8()?)?,
                reason: i.str()?,
            },
            STOP => ToRank::Stop {
                rank: Some(i.u32()?).filter(|&r| r != u32::MAX),
                reason: i.str()?,
            },
            END => ToRank::End,
            k => return Err(protocol(&format!("unknown message kind {k} to a rank"))),
        };
        i.end()?;
        Ok(m)
    }
}

/// Reads one frame's body from `r` into `buf`; `Ok(false)` when the peer closed before a
/// frame began.
pub(crate) fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    read_body(r, u32::from_le_bytes(len), buf)?;
    Ok(true)
}

/// Reads a body of `len` bytes (its length prefix already read) into `buf`.
pub(crate) fn read_body(r: &mut impl Read, len: u32, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let len = len as usize;
    if len > FRAME_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes, more than {FRAME_MAX_BYTES}"),
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf)
}

/// Checker of the fuzz target `node_wire` (and of a seeded unit test): arbitrary bytes, as a
/// message body to either side and as a stream of frames, never panic; a body that decodes
/// encodes back to the very same bytes (each message has one encoding), and decoding holds no
/// more than a bounded multiple of the bytes it was given.
#[cfg(any(test, fuzzing))]
pub fn fuzz_check(data: &[u8]) {
    if let Ok(m) = ToHost::decode(data) {
        let frame = m.encode();
        assert_eq!(&frame[4..], data, "{m:?} encodes back differently");
        if let ToHost::Hello { config, .. } = &m {
            // Each pair costs 8 bytes of the body at least.
            assert!(config.len() * 8 <= data.len());
        }
    }
    if let Ok(m) = ToRank::decode(data) {
        let frame = m.encode();
        assert_eq!(&frame[4..], data, "{m:?} encodes back differently");
        if let ToRank::Batch {
            samples, skipped, ..
        } = &m
        {
            assert!(samples.len() * 24 + skipped.len() * 4 <= data.len());
        }
    }
    // As a stream: frames read one after another until the bytes run out or one is refused.
    let mut r = data;
    let mut buf = Vec::new();
    while let Ok(true) = read_frame(&mut r, &mut buf) {
        assert!(buf.len() <= FRAME_MAX_BYTES && buf.len() <= data.len());
        let _ = ToHost::decode(&buf);
        let _ = ToRank::decode(&buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        assert_eq!(
            u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        &frame[4..]
    }

    #[test]
    fn every_message_comes_back_as_it_was_sent() {
        let to_host = [
            ToHost::Hello {
                local_rank: 3,
                pid: 4242,
                config: vec![
                    ("seed".into(), "7".into()),
                    ("dataset".into(), "/d ü".into()),
                ],
            },
            ToHost::Release { slot: 9 },
            ToHost::Want,
        ];
        for m in to_host {
            assert_eq!(ToHost::decode(body(&m.encode())).unwrap(), m);
        }
        let to_rank = [
            ToRank::Welcome {
                pid: 1,
                arena_bytes: 1 << 40,
                slots: 4,
                positions: "{\"job\": 1}".into(),
            },
            ToRank::Refused {
                field: "seed".into(),
                host: "1".into(),
                rank: "2".into(),
            },
            ToRank::Batch {
                slot: 2,
                epoch: 1,
                iteration: 77,
                samples: vec![
                    Placed {
                        id: 5,
                        label: 1,
                        offset: 1 << 33,
                        len: 150_528,
                    },
                    Placed {
                        id: 0,
                        label: 0,
                        offset: 0,
                        len: 0,
                    },
                ],
                skipped: vec![8, 9],
            },
            ToRank::Failed {
                kind: Failure::Decode,
                reason: "sample 4".into(),
            },
            ToRank::Stop {
                rank: Some(2),
                reason: "closed".into(),
            },
            ToRank::Stop {
                rank: None,
                reason: "loader".into(),
            },
            ToRank::End,
        ];
        for m in to_rank {
            assert_eq!(ToRank::decode(body(&m.encode())).unwrap(), m);
        }
    }

    #[test]
    fn damaged_messages_are_protocol_errors() {
        let frame = ToRank::Batch {
            slot: 0,
            epoch: 0,
            iteration: 0,
            samples: vec![Placed {
                id: 1,
                label: 2,
                offset: 3,
                len: 4,
            }],
            skipped: vec![],
        }
        .encode();
        let b = body(&frame);
        // Cut anywhere: refused, never a panic.
        for cut in 0..b.len() {
            assert!(ToRank::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = b.to_vec();
        long.push(0);
        assert!(ToRank::decode(&long).is_err());
        // A count claiming more samples than the bytes hold.
        let mut lying = b.to_vec();
        lying[13..17].copy_from_slice(&1000u32.to_le_bytes());
        assert!(ToRank::decode(&lying).is_err());
        assert!(ToHost::decode(&[99]).is_err());
    }

    #[test]
    fn frames_are_read_back_whole_and_oversized_ones_refused() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&ToHost::Release { slot: 1 }.encode());
        stream.extend_from_slice(&ToRank::End.encode());
        let mut r = std::io::Cursor::new(stream);
        let mut buf = Vec::new();
        assert!(read_frame(&mut r, &mut buf).unwrap());
        assert_eq!(ToHost::decode(&buf).unwrap(), ToHost::Release { slot: 1 });
        assert!(read_frame(&mut r, &mut buf).unwrap());
        assert_eq!(ToRank::decode(&buf).unwrap(), ToRank::End);
        assert!(!read_frame(&mut r, &mut buf).unwrap());
        let huge = (FRAME_MAX_BYTES as u32 + 1).to_le_bytes();
        assert!(read_frame(&mut std::io::Cursor::new(huge.to_vec()), &mut buf).is_err());
    }

    /// SplitMix64: a seeded stream of words, so a failure repeats.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn seeded_random_bytes_never_break_the_decoders() {
        let mut rng = Rng(0x10B5_7E12);
        let kinds = [
            HELLO, RELEASE, WANT, WELCOME, REFUSED, BATCH, FAILED, STOP, END, 0, 99,
        ];
        // Valid bodies, to mutate: random bytes alone rarely get past the kind.
        let valid: Vec<Vec<u8>> = [
            ToHost::Hello {
                local_rank: 1,
                pid: 2,
                config: vec![("seed".into(), "7".into()), ("a".into(), String::new())],
            }
            .encode(),
            ToHost::Release { slot: 3 }.encode(),
            ToRank::Refused {
                field: "seed".into(),
                host: "1".into(),
                rank: "2".into(),
            }
            .encode(),
            ToRank::Batch {
                slot: 1,
                epoch: 2,
                iteration: 3,
                samples: vec![Placed {
                    id: 4,
                    label: 5,
                    offset: 6,
                    len: 7,
                }],
                skipped: vec![8],
            }
            .encode(),
            ToRank::Failed {
                kind: Failure::Read,
                reason: "r".into(),
            }
            .encode(),
            ToRank::Stop {
                rank: None,
                reason: "s".into(),
            }
            .encode(),
        ]
        .into_iter()
        .map(|f| f[4..].to_vec())
        .collect();
        let mut decoded = 0;
        for case in 0..6000 {
            let data: Vec<u8> = match case % 3 {
                // Any bytes after a known kind.
                0 => {
                    let len = rng.below(64);
                    let mut v: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    v.insert(0, kinds[rng.below(kinds.len())]);
                    v
                }
                // A valid body with a few bytes changed, cut or grown.
                1 => {
                    let mut v = valid[rng.below(valid.len())].clone();
                    for _ in 0..rng.below(3) {
                        let at = rng.below(v.len());
                        v[at] = rng.next() as u8;
                    }
                    match rng.below(3) {
                        0 => v.truncate(rng.below(v.len() + 1)),
                        1 => v.push(rng.next() as u8),
                        _ => {}
                    }
                    v
                }
                // A stream of frames whose lengths may lie.
                _ => {
                    let mut v = Vec::new();
                    for _ in 0..1 + rng.below(3) {
                        let body = &valid[rng.below(valid.len())];
                        let len = match rng.below(4) {
                            0 => rng.next() as u32,
                            _ => body.len() as u32,
                        };
                        v.extend_from_slice(&len.to_le_bytes());
                        v.extend_from_slice(body);
                    }
                    v
                }
            };
            decoded += usize::from(ToHost::decode(&data).is_ok() || ToRank::decode(&data).is_ok());
            fuzz_check(&data);
        }
        // The cases reach past the decoders' first checks.
        assert!(decoded > 300, "only {decoded} cases decoded");
    }
}
