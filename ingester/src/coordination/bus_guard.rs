//! Healing a bus that lost its data: a nats-server that came back without its store (or
//! with an older copy of it), or a bucket purged by someone with the rights to. Every [`CHECK_INTERVAL`] the guard asks the bus to check its
//! buckets ([`NatsBus::check_buckets`]), which re-creates missing ones and bumps the bus's
//! loss count; every publisher sees that count change, reads the bus again (now empty, or
//! behind) and publishes everything it wants there. Servers replay the re-created buckets
//! without taking the empty bucket for mass deletes (see the server's pipeline).

use crate::coordination::metrics::CoordinationMetrics;
use shoal_common::bus::nats::NatsBus;
use std::time::Duration;
use tracing::{debug, warn};

/// How often the buckets are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Checks the buckets forever.
pub async fn run(bus: NatsBus, metrics: CoordinationMetrics) {
    loop {
        tokio::time::sleep(CHECK_INTERVAL).await;
        match bus.check_buckets().await {
            Ok(losses) => {
                for (bucket, loss) in losses {
                    warn!(
                        %bucket,
                        loss = loss.as_str(),
                        "bus bucket lost its data; re-created it, publishing everything again"
                    );
                    metrics.bus_heals.with_label_values(&[bucket.name()]).inc();
                }
            }
            Err(error) => debug!(%error, "cannot check the bus buckets; retrying"),
        }
    }
}
