//! Fetching a planned miss from the peer that holds it: the answer fills the sample's landing,
//! or, when the peer answers "miss" or not in time, the read goes to storage after all,
//! counted as a remote miss.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use lobster_net::Answer;
use lobster_sched::Tier;

use crate::pipeline::access::{self, Access};
use crate::pipeline::context::Context;
use crate::pipeline::io::order::ToDispatcher;
use crate::pipeline::landing::Origin;
use crate::pipeline::state::PipelineState;
use crate::pipeline::sync::lock;

/// Fetches `access`'s sample from `peer`; the answer fills its landing, or sends the read to
/// the dispatcher.
pub(crate) fn start<T: Send + 'static>(
    ctx: &Arc<Context<T>>,
    state: &Arc<PipelineState<T>>,
    access: Access,
    peer: usize,
) {
    let peers = ctx.peers.as_ref().expect("a peer fetch has peers");
    peers.counters.planned.fetch_add(1, Ordering::Relaxed);
    // Weak: an answer must not keep a dropped loader alive on the transport's thread, whose
    // teardown (the link's, MPI's) belongs to the thread that drops the loader.
    let (c, s) = (Arc::downgrade(ctx), Arc::downgrade(state));
    let gate = peers.gate.clone();
    let sample = access.sample;
    let issued = Instant::now();
    peers.transport.fetch(
        peer,
        sample,
        Box::new(move |answer| {
            let Some(_open) = gate.enter() else {
                return;
            };
            if let (Some(c), Some(s)) = (c.upgrade(), s.upgrade()) {
                answered(&c, &s, access, peer, issued, answer);
            }
        }),
    );
}

fn answered<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    mut access: Access,
    peer: usize,
    issued: Instant,
    answer: Answer,
) {
    match settle(ctx, state, access.sample, peer, issued, answer) {
        Some(bytes) => {
            let mut released = Vec::new();
            // A kept sample is copied out of the message it came in.
            access::fill_for(
                access,
                Ok(bytes),
                (Origin::Pool, ctx.arena.as_ref()),
                &mut released,
            );
            state.ready(released);
        }
        None => {
            state.read_path.dispatched.fetch_add(1, Ordering::Relaxed);
            access.read = ctx.storage_read(access.epoch, access.iteration as usize, access.sample);
            let tx = state.to_dispatcher.as_ref().expect("pipelined");
            // Fails only once the pipeline stops, which then ends the sample anyway.
            let _ = tx.send(ToDispatcher::Reads(vec![access]));
        }
    }
}

/// Fetches `sample` from `peer` and waits for the answer (a read-then-decode worker):
/// its bytes, or `None` when storage must serve it.
pub(crate) fn blocking<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    sample: u32,
    peer: usize,
) -> Option<Bytes> {
    let peers = ctx.peers.as_ref().expect("a peer fetch has peers");
    peers.counters.planned.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let issued = Instant::now();
    peers.transport.fetch(
        peer,
        sample,
        Box::new(move |answer| {
            let _ = tx.send(answer);
        }),
    );
    let answer = rx
        .recv()
        .unwrap_or_else(|_| Answer::Failed("the transport dropped the fetch".into()));
    settle(ctx, state, sample, peer, issued, answer)
}

/// The answer's bytes if they are the sample's, counted as a remote hit and observed by the
/// cost model; anything else is counted as a remote miss.
fn settle<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    sample: u32,
    peer: usize,
    issued: Instant,
    answer: Answer,
) -> Option<Bytes> {
    let counters = &ctx.peers.as_ref().expect("a peer fetch has peers").counters;
    let size_bytes = ctx.meta(sample).size_bytes;
    match answer {
        Answer::Bytes(b) if b.len() as u64 == size_bytes => {
            counters.hits.fetch_add(1, Ordering::Relaxed);
            counters.hit_bytes.fetch_add(size_bytes, Ordering::Relaxed);
            lock(&state.model).observe_read(Tier::Remote, size_bytes, issued.elapsed());
            return Some(b);
        }
        Answer::Bytes(b) => log::warn!(
            "node {peer} sent {} bytes for sample {sample} of {size_bytes}: read from storage",
            b.len()
        ),
        Answer::Miss => {}
        Answer::TimedOut => {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        Answer::Failed(why) => log::warn!("fetching sample {sample} from node {peer}: {why}"),
    }
    counters.misses.fetch_add(1, Ordering::Relaxed);
    None
}
