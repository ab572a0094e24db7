//! What one stream has asked for of one xDS type and what it holds: one record for SotW and
//! delta streams alike (go-control-plane's `stream/v3/subscription.go`).

use crate::push::view::{Held, Names, NamesChange};

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
