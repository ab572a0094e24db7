//! What one stream has asked for of one xDS type and what it holds: one record for SotW and
//! delta streams alike (go-control-plane's `stream/v3/subscription.go`).

use crate::push::view::{Held, Names, NamesChange};
use std::collections::BTreeSet;

/// One type's subscription on a stream.
#[derive(Debug, Default)]
pub(crate) struct Subscription {
    /// Subscribed to everything: delta's wildcard (CDS and LDS always are); a SotW stream
    /// says it by naming nothing.
    pub wildcard: bool,
    /// Requested names, shared with the view's other streams that requested the same names.
    pub names: Names,
    /// What the proxy holds: what was last sent (SotW, for partial EDS pushes), or seeded
    /// from `initial_resource_versions` and kept per resource (delta).
    pub held: Held,
    /// How `names` were made from the previous ones, until the next response (delta).
    pub change: Option<NamesChange>,
}

/// Clusters sent changed whose assignments must be sent again, changed or not.
///
/// Envoy warms an updated EDS cluster until it receives that cluster's assignment after
/// the update (go-control-plane#245). An assignment that did not change is otherwise not
/// resent, so the updated cluster never warms: the old one keeps serving, and while a
/// proxy starts, its listeners are not even requested until every cluster has warmed
/// (seen as a new pod's sidecar without listeners for 15 s, Envoy's initial fetch
/// timeout). istiod sends every assignment after a cluster change; shoal sends those of
/// the clusters that changed.
#[derive(Debug, Default)]
pub(crate) struct Warming {
    /// A set: a stream that never subscribes to EDS keeps at most one entry per cluster.
    clusters: BTreeSet<String>,
}

impl Warming {
    /// A CDS response sends these clusters (new or changed).
    pub fn clusters_sent<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        self.clusters.extend(names.into_iter().map(str::to_string));
    }

    /// Whether an EDS response is owed.
    pub fn pending(&self) -> bool {
        !self.clusters.is_empty()
    }

    /// Makes the EDS subscription's next diff include the owed assignments: the proxy is
    /// taken not to hold them (an EDS cluster's assignment has the cluster's name).
    pub fn apply(&mut self, endpoints: &mut Held) {
        for name in std::mem::take(&mut self.clusters) {
            endpoints.forget(&name);
        }
    }
}
