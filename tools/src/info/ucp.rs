//! `-e`: what UCP makes of this host's transports: a worker's endpoint to itself, or (`-p`)
//! to a second worker of this process, with the lanes it selected and the protocol of each
//! message-size range (what `RUCX_PROTO_INFO=y` prints when an endpoint is created).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Writes the report; `peer`: connect to a second worker rather than to the worker itself.
pub fn report(ctx: &uct::Context, peer: bool, out: &mut String) -> ucs::Result<()> {
    let uctx = ucp::Context::builder(ctx.clone()).build()?;
    let a = ucp::Worker::new(&uctx)?;
    let b = if peer {
        Some(ucp::Worker::new(&uctx)?)
    } else {
        None
    };
    let target = b.as_ref().unwrap_or(&a);
    let ep = a.connect(target.address())?;
    // Wireup finishes over the lanes themselves; a bound keeps a broken transport from hanging.
    let start = Instant::now();
    while !ep.is_connected() && start.elapsed() < Duration::from_secs(10) {
        a.progress();
        if let Some(b) = &b {
            b.progress();
        }
    }
    let _ = writeln!(out, "#");
    let _ = writeln!(
        out,
        "# UCP endpoint to {}",
        if peer { "a second worker" } else { "its own worker" }
    );
    let _ = writeln!(out, "#   resources: {}", uctx.resource_names().join(", "));
    if !ep.is_connected() {
        let _ = writeln!(out, "#   (wireup did not finish within 10 s)");
    }
    let _ = writeln!(out, "#");
    for l in ep.describe_lanes().lines().chain(ep.describe_protocols().lines()) {
        let _ = writeln!(out, "# {}", l.trim_start());
    }
    Ok(())
}
