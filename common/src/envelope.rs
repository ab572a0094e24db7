//! The wire envelope: every value on the bus is an rmp-serde encoded [`Envelope`].

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The schema version this build writes and accepts. Bump on incompatible model changes,
/// so older servers reject newer payloads loudly instead of misreading them.
pub const SCHEMA_VERSION: u32 = 1;

/// A value on the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Schema version of `body`.
    pub schema: u32,
    /// The fleet of the ingester that wrote this value.
    pub fleet: String,
    /// The writer's epoch (lease generation).
    pub epoch: u64,
    /// When the ingester observed the change, in ms since the Unix epoch.
    pub observed_at_ms: u64,
    /// The normalized object.
    pub body: T,
}

/// A payload that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The payload was written with a schema this build does not understand.
    #[error("payload schema {found} is not supported (this build reads schema {supported})")]
    Schema {
        /// Schema in the payload.
        found: u32,
        /// Schema this build supports.
        supported: u32,
    },
    /// The payload is not valid msgpack for the expected type.
    #[error("payload does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// The value could not be encoded.
    #[error("value does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

#[derive(Deserialize)]
struct SchemaOnly {
    schema: u32,
}

impl<T: Serialize> Envelope<T> {
    /// Wraps a body, stamped with the current schema and time.
    pub fn new(fleet: impl Into<String>, epoch: u64, observed_at_ms: u64, body: T) -> Self {
        Envelope {
            schema: SCHEMA_VERSION,
            fleet: fleet.into(),
            epoch,
            observed_at_ms,
            body,
        }
    }

    /// Encodes to msgpack (struct fields as maps, so fields can be added compatibly).
    pub fn encode(&self) -> Result<Vec<u8>, EnvelopeError> {
        Ok(rmp_serde::to_vec_named(self)?)
    }
}

impl<T: DeserializeOwned> Envelope<T> {
    /// Decodes, checking the schema version before the body.
    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let head: SchemaOnly = rmp_serde::from_slice(bytes)?;
        if head.schema != SCHEMA_VERSION {
            return Err(EnvelopeError::Schema {
                found: head.schema,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(rmp_serde::from_slice(bytes)?)
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_schema_check() {
        let e = Envelope::new("f", 3, 42, "body".to_string());
        let bytes = e.encode().unwrap();
        assert_eq!(Envelope::<String>::decode(&bytes).unwrap(), e);
        let mut future = e.clone();
        future.schema = SCHEMA_VERSION + 1;
        let bytes = future.encode().unwrap();
        assert!(matches!(
            Envelope::<String>::decode(&bytes),
            Err(EnvelopeError::Schema { .. })
        ));
        assert!(matches!(
            Envelope::<String>::decode(b"\xc1"),
            Err(EnvelopeError::Decode(_))
        ));
    }

    use crate::model::{ConfigObject, EndpointSet, Service};
    use proptest::prelude::*;

    /// Decodes `bytes` as every body type the bus carries; only `Ok`/`Err` may come out.
    fn decode_all(bytes: &[u8]) {
        let _ = Envelope::<String>::decode(bytes);
        let _ = Envelope::<ConfigObject>::decode(bytes);
        let _ = Envelope::<Service>::decode(bytes);
        let _ = Envelope::<EndpointSet>::decode(bytes);
        let _ = Envelope::<crate::model::ClusterIssuer>::decode(bytes);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(512), ..ProptestConfig::default() })]

        #[test]
        fn prop_arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            decode_all(&bytes);
        }

        /// Valid envelopes with bytes flipped, cut short or extended decode or fail cleanly.
        #[test]
        fn prop_mutated_envelopes_never_panic(
            fleet in ".{0,12}",
            epoch in any::<u64>(),
            body in ".{0,40}",
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
            tail in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut bytes = Envelope::new(fleet, epoch, 1, body).encode().expect("encodes");
            for (at, byte) in flips {
                let at = at % bytes.len();
                bytes[at] ^= byte;
            }
            decode_all(&bytes);
            bytes.truncate(cut % (bytes.len() + 1));
            decode_all(&bytes);
            bytes.extend(tail);
            decode_all(&bytes);
        }

        #[test]
        fn prop_valid_envelopes_round_trip(
            fleet in ".{0,12}",
            epoch in any::<u64>(),
            observed in any::<u64>(),
            body in prop::collection::vec(".{0,16}", 0..6),
        ) {
            let e = Envelope { schema: SCHEMA_VERSION, fleet, epoch, observed_at_ms: observed, body };
            let bytes = e.encode().expect("encodes");
            prop_assert_eq!(Envelope::<Vec<String>>::decode(&bytes).expect("decodes"), e);
        }

        /// Any other schema is refused as such, whatever the body.
        #[test]
        fn prop_other_schemas_are_refused(schema in any::<u32>(), body in ".{0,16}") {
            prop_assume!(schema != SCHEMA_VERSION);
            let e = Envelope { schema, fleet: "f".to_string(), epoch: 1, observed_at_ms: 1, body };
            let bytes = e.encode().expect("encodes");
            let is_schema_error = matches!(
                Envelope::<ConfigObject>::decode(&bytes),
                Err(EnvelopeError::Schema { found, .. }) if found == schema
            );
            prop_assert!(is_schema_error);
        }
    }
}
