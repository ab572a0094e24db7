//! A resource's response entries, written from its encoding without copying it, are the
//! bytes prost writes for the same messages.

use crate::generate::Resource;
use prost::Message as _;
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as PbResource,
};
use shoal_proto::XdsType;

#[test]
fn entries_are_prosts_encoding() {
    // Empty, small, and past the one- and two-byte lengths.
    for size in [0, 100, 20_000, 300_000] {
        let value: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        for aliases in [
            vec![],
            vec!["a.ns.svc.cluster.local".to_string(), "b".into()],
        ] {
            let r = Resource::from_encoded(XdsType::Route, "80".into(), value.clone())
                .with_aliases(aliases.clone());
            let delta = DeltaDiscoveryResponse {
                resources: vec![PbResource {
                    name: r.name.clone(),
                    version: r.version.clone(),
                    resource: Some(r.any.clone()),
                    aliases,
                    ..Default::default()
                }],
                ..Default::default()
            };
            assert_eq!(
                r.delta_entry()[..],
                delta.encode_to_vec()[..],
                "delta, {size} bytes"
            );
            let sotw = DiscoveryResponse {
                resources: vec![r.any.clone()],
                ..Default::default()
            };
            assert_eq!(
                r.sotw_entry()[..],
                sotw.encode_to_vec()[..],
                "sotw, {size} bytes"
            );
        }
    }
}
