//! The planner's fetch of a planned miss from the peer that holds it: the answer fills the
//! sample's landing and goes to the decode queues, or, when the peer answers "miss" or not in
//! time, the read goes to the dispatcher after all.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use lobster_net::Answer;

use super::handles::ForPlanner;
use crate::pipeline::access::{self, Access};
use crate::pipeline::context::Context;
use crate::pipeline::io::order::ToDispatcher;
use crate::pipeline::landing::Origin;
use crate::pipeline::peers::fetch::settle;

/// Fetches `access`'s sample from `peer`; the answer fills its landing, or sends the read to
/// the dispatcher.
pub(crate) fn start<T: Send + 'static>(
    ctx: &Arc<Context<T>>,
    state: &Arc<ForPlanner<T>>,
    access: Access,
    peer: usize,
) {
    let peers = state.peers.as_ref().expect("a peer fetch has peers");
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
    state: &ForPlanner<T>,
    mut access: Access,
    peer: usize,
    issued: Instant,
    answer: Answer,
) {
    let peers = state.peers.as_deref().expect("a peer fetch has peers");
    let size_bytes = ctx.meta(access.sample).size_bytes;
    match settle(
        peers,
        &state.model,
        (access.sample, size_bytes),
        peer,
        issued,
        answer,
    ) {
        Some(bytes) => {
            let mut released = Vec::new();
            // A kept sample is copied out of the message it came in.
            access::fill_for(
                access,
                Ok(bytes),
                (Origin::Pool, ctx.arena.as_ref()),
                &mut released,
            );
            state.decode.push(released);
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
