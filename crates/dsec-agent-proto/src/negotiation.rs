//! Version negotiation: what each side's `Hello` says, and how the version
//! and the features of a connection are picked from the two.
//!
//! # The Hello's wire form (frozen)
//! postcard is not self-describing: a decoder reads fields by position and
//! cannot skip what it does not know. So the Hello, the one message both
//! sides must read before they know anything of each other, has a prefix
//! that never changes, and grows only at its end:
//!
//! ```text
//! ToAgent::Hello    0x00 | protocol_version (varint u32) | [Offer]
//! FromAgent::Hello  0x00 | protocol_version (varint u32) | agent_version (string) | state (AgentState) | [Offer]
//! Offer             min_version (varint u32) | features (count, then strings)
//! ```
//!
//! - `Hello` stays variant 0 of both enums, and the prefix's fields, their
//!   order and their types (`AgentState`'s two variants included) never
//!   change.
//! - The Hello is alone in its frame and a decoder ignores what follows
//!   what it knows (postcard's `from_bytes` does, and so did every agent
//!   and edge since protocol 1): an older peer reads the prefix of a newer
//!   Hello and never sees the [`Offer`].
//! - A newer decoder reads the [`Offer`] only if bytes follow the prefix;
//!   without one the peer predates negotiation ([`Speaks::strict`]): it
//!   speaks exactly its `protocol_version`, with the features that version
//!   implies ([`Feature::implied_since`]), and it refuses a Hello whose
//!   version differs from its own.
//! - The [`Offer`]'s own layout is frozen too. Should a Hello ever need
//!   more, another part goes after the Offer, read only when bytes remain.
//!
//! `hello_golden_bytes` (below) keeps these bytes as they are.
//!
//! # Picking the version
//! Each side offers a range, `min_version..=protocol_version`, and a set of
//! named features. The connection speaks the highest version in both
//! ranges ([`Speaks::agree`]); both sides compute it from the two Hellos,
//! so nothing more is exchanged. No common version, or a strict peer that
//! would get another version than its own, is a refusal that names both
//! ranges. The features of the connection are those the agent announced
//! that the edge knows.
//!
//! Who speaks first: an agent always says Hello first. The edge either
//! answers it ([`crate::client::AgentClient::answer`]: its Hello then names
//! the version it picked, which is how an agent from before negotiation,
//! expecting exactly its own version, still works with a newer edge), or
//! says Hello at once ([`crate::client::AgentClient::connect`]: needed where
//! the agent may be waiting for the edge, a VM's agent on a port whose host
//! side came back while the VM was stopped; its Hello then names the
//! edge's own version).
//!
//! # Versions and features
//! The version is the messages' layout: a change that older decoders would
//! misread (a field inserted before others, a type changed) is a new
//! version, and an edge talking to an older agent encodes for that agent's
//! version or refuses what it cannot encode. A change an older agent can
//! decode but would not honour (a new `Op` appended to the enum: an older
//! agent drops the frame as undecodable and never answers; a field appended
//! to the struct that ends a request's frame, which an older agent ignores)
//! is a [`Feature`]: the edge refuses a request that needs one the agent
//! lacks, with an error that says so, before it sends anything.
//!
//! # History
//! | version | added | what gates it with an agent of the oldest supported version |
//! |---|---|---|
//! | 2 | `ContainerSetup::sys_dir`, inserted mid-struct | layout: below [`MIN_PROTOCOL_VERSION`], refused |
//! | 3 | `ContainerSetup::syscall_filter` (mid-struct), `Op::AuditEvents`, `Reply::Audit`; later, without a bump: `Op::SetupVm`, `Op::ChangedSince`, `Op::RecordAudit` | below the minimum, refused: a "3" may lack any of the later ops |
//! | 4 | `FromAgent::Audited`, the container agent's parked descriptors of its masked paths; later, without a bump: `Op::Reidentify`, `ContainerSetup::resolv_conf` | the minimum: every agent has them (protocol 4 means its last state, before 5) |
//! | 5 | `VmSetup::nic` (the last field of the last message of a `SetupVm` frame) | [`Feature::VmNic`]: a setup with a NIC is refused, one without is sent as is (a protocol 4 agent ignores the trailing `None`) |
//! | 5 | later, without a bump: `Op::ConnectPort` | [`Feature::PortForward`]: refused before it is sent to an agent that does not announce it |

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{AgentState, Op, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// A capability a peer within the supported range of versions may lack.
/// Its number is its row in [`FEATURES`] and its bit in [`Features`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Feature {
    /// `VmSetup::nic`: a full VM's agent sets its NIC up during the setup.
    VmNic,
    /// `Op::ConnectPort`: the agent relays a connection to a port of the
    /// sandbox's loopback (how a VM's ports are reached).
    PortForward,
}

/// One row of [`FEATURES`].
pub struct FeatureInfo {
    pub feature: Feature,
    /// The wire name, in [`Offer::features`].
    pub name: &'static str,
    /// Peers from before negotiation have the feature from this version on.
    pub implied_since: u32,
    /// What it gates, for the refusal's message.
    pub gates: &'static str,
}

/// Every feature, as data, in the order of [`Feature`]. A name is never
/// reused; a peer ignores names it does not know (a newer peer's features
/// cost an older one nothing).
pub const FEATURES: &[FeatureInfo] = &[
    FeatureInfo {
        feature: Feature::VmNic,
        name: "vm_nic",
        implied_since: 5,
        gates: "the setup of a networked full VM's NIC (VmSetup::nic)",
    },
    FeatureInfo {
        feature: Feature::PortForward,
        name: "port_forward",
        // Newer than every agent from before negotiation.
        implied_since: u32::MAX,
        gates: "connections to a port inside a VM (Op::ConnectPort)",
    },
];

impl Feature {
    pub fn info(self) -> &'static FeatureInfo {
        // In range and the right row: `feature_table_is_complete`.
        &FEATURES[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn implied_since(self) -> u32 {
        self.info().implied_since
    }

    fn bit(self) -> u64 {
        1 << (self as u8)
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Feature`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(u64);

impl Features {
    /// Every feature this build has.
    pub fn all() -> Features {
        Features(FEATURES.iter().fold(0, |bits, f| bits | f.feature.bit()))
    }

    /// The known features among `names`.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Features {
        let bits = names.into_iter().filter_map(|n| FEATURES.iter().find(|f| f.name == n)).fold(0, |bits, f| bits | f.feature.bit());
        Features(bits)
    }

    /// What a peer from before negotiation has at `version`.
    pub fn implied_by(version: u32) -> Features {
        Features(FEATURES.iter().filter(|f| f.implied_since <= version).fold(0, |bits, f| bits | f.feature.bit()))
    }

    pub fn has(self, feature: Feature) -> bool {
        self.0 & feature.bit() != 0
    }

    pub fn names(self) -> Vec<String> {
        FEATURES.iter().filter(|f| self.has(f.feature)).map(|f| f.name.to_string()).collect()
    }

    fn and(self, other: Features) -> Features {
        Features(self.0 & other.0)
    }
}

/// What a Hello says beyond its frozen prefix (absent from the Hello of a
/// peer that predates negotiation).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Offer {
    /// The oldest version the sender still speaks.
    pub min_version: u32,
    /// The sender's features, by name.
    pub features: Vec<String>,
}

impl Offer {
    /// This build's.
    pub fn ours() -> Offer {
        Offer { min_version: MIN_PROTOCOL_VERSION, features: Features::all().names() }
    }
}

/// The edge's Hello.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeHello {
    /// The highest version the edge speaks on this connection: its own, or,
    /// when it answers the agent's Hello, the one it picked.
    pub protocol_version: u32,
    pub offer: Option<Offer>,
}

/// The agent's Hello.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentHello {
    /// The highest version the agent speaks.
    pub protocol_version: u32,
    /// The agent binary's version (its crate version), for diagnostics.
    pub agent_version: String,
    pub state: AgentState,
    pub offer: Option<Offer>,
}

impl EdgeHello {
    /// This build's Hello, announcing `protocol_version`.
    pub fn ours(protocol_version: u32) -> EdgeHello {
        EdgeHello { protocol_version, offer: Some(Offer::ours()) }
    }

    pub fn speaks(&self) -> Speaks {
        Speaks::from_hello(self.protocol_version, self.offer.as_ref())
    }
}

impl AgentHello {
    /// This build's Hello.
    pub fn ours(agent_version: impl Into<String>, state: AgentState) -> AgentHello {
        AgentHello { protocol_version: PROTOCOL_VERSION, agent_version: agent_version.into(), state, offer: Some(Offer::ours()) }
    }

    pub fn speaks(&self) -> Speaks {
        Speaks::from_hello(self.protocol_version, self.offer.as_ref())
    }
}

/// What one side speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speaks {
    pub min: u32,
    pub max: u32,
    pub features: Features,
    /// The peer predates negotiation: it accepts only a Hello of exactly
    /// `max` (`min == max`).
    pub strict: bool,
}

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub version: u32,
    /// The agent's features that the edge knows too.
    pub features: Features,
}

/// Why two sides cannot talk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(.ours, .peer))]
pub struct Mismatch {
    pub ours: Speaks,
    pub peer: Speaks,
}

fn range(s: &Speaks) -> String {
    if s.strict {
        format!("only protocol {} (it predates version negotiation)", s.max)
    } else if s.min == s.max {
        format!("protocol {}", s.max)
    } else {
        format!("protocols {} to {}", s.min, s.max)
    }
}

fn describe(ours: &Speaks, peer: &Speaks) -> String {
    format!("the peer speaks {}, this side {}", range(peer), range(ours))
}

impl Mismatch {
    /// Whose upgrade would fix it: true if the peer is the older side.
    pub fn peer_is_older(&self) -> bool {
        self.peer.max < self.ours.max
    }

    /// Both ranges, with `peer` and `us` naming the two sides.
    pub fn describe_as(&self, peer: &str, us: &str) -> String {
        format!("{peer} speaks {}, {us} {}", range(&self.peer), range(&self.ours))
    }
}

impl Speaks {
    /// This build's.
    pub fn ours() -> Speaks {
        Speaks { min: MIN_PROTOCOL_VERSION, max: PROTOCOL_VERSION, features: Features::all(), strict: false }
    }

    fn from_hello(version: u32, offer: Option<&Offer>) -> Speaks {
        match offer {
            Some(o) => Speaks {
                min: o.min_version.min(version),
                max: version,
                features: Features::from_names(o.features.iter().map(String::as_str)),
                strict: false,
            },
            None => Speaks { min: version, max: version, features: Features::implied_by(version), strict: true },
        }
    }

    /// The highest version both speak, and the features of the connection
    /// (`self` is the edge or the agent, `peer` the other). `said`: the
    /// version our own Hello announced; `None` if it is yet to be sent and
    /// will announce the result. A strict peer refuses any other version
    /// than its own.
    pub fn agree(&self, peer: &Speaks, said: Option<u32>) -> Result<Negotiated, Mismatch> {
        let version = self.max.min(peer.max);
        let mismatch = || Mismatch { ours: *self, peer: *peer };
        if version < self.min.max(peer.min) {
            return Err(mismatch());
        }
        if peer.strict && said.unwrap_or(version) != peer.max {
            return Err(mismatch());
        }
        Ok(Negotiated { version, features: self.features.and(peer.features) })
    }
}

impl Op {
    /// The feature the agent needs to honour this request, if any.
    pub fn requires(&self) -> Option<Feature> {
        match self {
            Op::SetupVm(setup) if setup.nic.is_some() => Some(Feature::VmNic),
            Op::ConnectPort { .. } => Some(Feature::PortForward),
            _ => None,
        }
    }
}

// The Hellos' serde, by hand: the Offer is written only when present and
// read only when bytes remain (see the module's docs).

impl Serialize for EdgeHello {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(1 + usize::from(self.offer.is_some()))?;
        t.serialize_element(&self.protocol_version)?;
        if let Some(offer) = &self.offer {
            t.serialize_element(offer)?;
        }
        t.end()
    }
}

impl Serialize for AgentHello {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3 + usize::from(self.offer.is_some()))?;
        t.serialize_element(&self.protocol_version)?;
        t.serialize_element(&self.agent_version)?;
        t.serialize_element(&self.state)?;
        if let Some(offer) = &self.offer {
            t.serialize_element(offer)?;
        }
        t.end()
    }
}

fn required<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(seq: &mut A, at: usize, what: &dyn de::Expected) -> Result<T, A::Error> {
    seq.next_element()?.ok_or_else(|| de::Error::invalid_length(at, what))
}

/// The Offer after a Hello's prefix, if the frame holds one. postcard says
/// "end of input" where there is none; an Offer that does not decode counts
/// as absent too (its sender is then held to its prefix alone).
fn trailing_offer<'de, A: SeqAccess<'de>>(seq: &mut A) -> Option<Offer> {
    seq.next_element().ok().flatten()
}

impl<'de> Deserialize<'de> for EdgeHello {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EdgeHello;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an edge's Hello")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EdgeHello, A::Error> {
                let protocol_version = required(&mut seq, 0, &self)?;
                Ok(EdgeHello { protocol_version, offer: trailing_offer(&mut seq) })
            }
        }
        d.deserialize_tuple(2, V)
    }
}

impl<'de> Deserialize<'de> for AgentHello {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AgentHello;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an agent's Hello")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AgentHello, A::Error> {
                let protocol_version = required(&mut seq, 0, &self)?;
                let agent_version = required(&mut seq, 1, &self)?;
                let state = required(&mut seq, 2, &self)?;
                Ok(AgentHello { protocol_version, agent_version, state, offer: trailing_offer(&mut seq) })
            }
        }
        d.deserialize_tuple(4, V)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::{decode, encode};
    use crate::{FromAgent, ToAgent, VmNic, VmSetup};

    fn speaks(min: u32, max: u32, features: Features) -> Speaks {
        Speaks { min, max, features, strict: false }
    }

    fn legacy(version: u32) -> Speaks {
        Speaks { min: version, max: version, features: Features::implied_by(version), strict: true }
    }

    #[test]
    fn feature_table_is_complete() {
        for f in [Feature::VmNic, Feature::PortForward] {
            // Fails to compile when a variant is added: list it above too.
            match f {
                Feature::VmNic | Feature::PortForward => assert_eq!(f.info().feature, f),
            }
        }
        for (i, f) in FEATURES.iter().enumerate() {
            assert_eq!(f.feature as usize, i, "{} is not in its row", f.name);
            assert!(FEATURES[..i].iter().all(|g| g.name != f.name), "{} twice", f.name);
            // A feature older than the minimum would be in every accepted
            // peer: it is part of the baseline instead.
            // (u32::MAX: no peer from before negotiation has it.)
            assert!(f.implied_since == u32::MAX || (MIN_PROTOCOL_VERSION + 1..=PROTOCOL_VERSION).contains(&f.implied_since), "{}", f.name);
        }
        assert_eq!(Features::from_names(Features::all().names().iter().map(String::as_str)), Features::all());
        assert_eq!(Features::from_names(["no_such_feature"]), Features::default());
    }

    #[test]
    fn same_version() {
        let n = Speaks::ours().agree(&Speaks::ours(), Some(PROTOCOL_VERSION)).unwrap();
        assert_eq!(n, Negotiated { version: PROTOCOL_VERSION, features: Features::all() });
    }

    #[test]
    fn older_agent_within_range_works_with_its_features_off() {
        let edge = speaks(4, 6, Features::all());
        let agent = speaks(4, 4, Features::default());
        let n = edge.agree(&agent, None).unwrap();
        assert_eq!(n.version, 4);
        assert!(!n.features.has(Feature::VmNic));
        // The agent computes the same from the edge's Hello, whichever
        // version that Hello announced.
        assert_eq!(agent.agree(&edge, Some(4)).unwrap().version, 4);
        assert_eq!(agent.agree(&EdgeHello::ours(4).speaks(), Some(4)).unwrap().version, 4);
    }

    #[test]
    fn older_than_the_minimum_is_refused_naming_both_ranges() {
        let edge = speaks(4, 6, Features::all());
        let agent = speaks(2, 3, Features::default());
        let e = edge.agree(&agent, None).unwrap_err();
        assert!(e.peer_is_older());
        assert_eq!(e.describe_as("the agent", "the edge"), "the agent speaks protocols 2 to 3, the edge protocols 4 to 6");
        // And the other way round, as the agent sees it.
        let e = agent.agree(&edge, Some(3)).unwrap_err();
        assert_eq!(e.to_string(), "the peer speaks protocols 4 to 6, this side protocols 2 to 3");
    }

    #[test]
    fn newer_agent_gets_the_edges_version() {
        let edge = speaks(4, 5, Features::all());
        let agent = speaks(4, 9, Features::from_names(["vm_nic", "from_the_future"]));
        let n = edge.agree(&agent, None).unwrap();
        // The features of both: the agent's known ones.
        assert_eq!(n, Negotiated { version: 5, features: Features::from_names(["vm_nic"]) });
        assert_eq!(agent.agree(&edge, Some(9)).unwrap().version, 5);
        // An agent that dropped the edge's version is too new for it.
        let e = edge.agree(&speaks(6, 9, Features::all()), None).unwrap_err();
        assert!(!e.peer_is_older());
    }

    /// A peer from before negotiation accepts only its own version: fine
    /// when answered with it, a refusal when the edge already said another.
    #[test]
    fn a_strict_peer_gets_its_own_version_or_nothing() {
        let edge = speaks(4, 6, Features::all());
        let n = edge.agree(&legacy(4), None).unwrap();
        assert_eq!(n, Negotiated { version: 4, features: Features::default() });
        // What version 5 implies; a feature newer than negotiation is never implied.
        assert_eq!(edge.agree(&legacy(5), None).unwrap().features, Features::from_names(["vm_nic"]));
        assert!(!edge.agree(&legacy(5), None).unwrap().features.has(Feature::PortForward));
        assert!(edge.agree(&legacy(4), Some(6)).is_err());
        assert!(edge.agree(&legacy(7), None).is_err(), "its version is above ours");
        assert!(edge.agree(&legacy(3), None).is_err(), "below the minimum");
    }

    pub(crate) fn vm_setup(nic: Option<VmNic>) -> VmSetup {
        VmSetup {
            sandbox_id: "sb".into(),
            hostname: "h".into(),
            layer_disks: vec!["l0".into()],
            writable_disk: "w".into(),
            now_ms: 1,
            masked_paths: vec![],
            readonly_paths: vec![],
            env: vec![],
            workdir: "/".into(),
            default_user: "root".into(),
            nic,
        }
    }

    pub(crate) fn nic() -> VmNic {
        VmNic { mac: "52:54:00:12:34:56".into(), address: [10, 0, 2, 15].into(), prefix: 24, gateway: [10, 0, 2, 2].into() }
    }

    #[test]
    fn only_a_setup_with_a_nic_needs_vm_nic() {
        assert_eq!(Op::SetupVm(vm_setup(Some(nic()))).requires(), Some(Feature::VmNic));
        assert_eq!(Op::SetupVm(vm_setup(None)).requires(), None);
        assert_eq!(Op::Ping.requires(), None);
    }

    /// `VmSetup` as protocol 4 had it (no `nic`).
    #[derive(Deserialize, Debug, PartialEq)]
    struct VmSetupV4 {
        sandbox_id: String,
        hostname: String,
        layer_disks: Vec<String>,
        writable_disk: String,
        now_ms: u64,
        masked_paths: Vec<String>,
        readonly_paths: Vec<String>,
        env: Vec<(String, String)>,
        workdir: String,
        default_user: String,
    }

    /// Why a setup without a NIC goes to a protocol 4 agent unchanged: the
    /// setup ends its frame, and the field a protocol 4 agent does not know
    /// is the setup's last.
    #[test]
    fn a_setup_without_a_nic_reads_the_same_to_a_protocol_4_agent() {
        let setup = vm_setup(None);
        let bytes = postcard::to_allocvec(&setup).unwrap();
        let frame = encode(&ToAgent::Request { id: 9, op: Op::SetupVm(setup.clone()) }).unwrap();
        assert!(frame.ends_with(&bytes));
        let old: VmSetupV4 = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            (old.sandbox_id.as_str(), old.layer_disks.as_slice(), old.default_user.as_str()),
            ("sb", &["l0".to_string()][..], "root")
        );
    }

    /// The Hellos as every agent and edge since protocol 1 declared them.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum LegacyToAgent {
        Hello { protocol_version: u32 },
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum LegacyFromAgent {
        Hello { protocol_version: u32, agent_version: String, state: AgentState },
    }

    /// The frozen prefix, byte for byte, and the Offer after it.
    #[test]
    fn hello_golden_bytes() {
        let body = |frame: Vec<u8>| frame[4..].to_vec();
        assert_eq!(body(encode(&ToAgent::Hello(EdgeHello { protocol_version: 5, offer: None })).unwrap()), [0x00, 0x05]);
        let edge = EdgeHello { protocol_version: 5, offer: Some(Offer { min_version: 4, features: vec!["vm_nic".into()] }) };
        assert_eq!(body(encode(&ToAgent::Hello(edge)).unwrap()), [0x00, 0x05, 0x04, 0x01, 0x06, b'v', b'm', b'_', b'n', b'i', b'c']);
        let agent = AgentHello { protocol_version: 300, agent_version: "0.1".into(), state: AgentState::Fresh, offer: None };
        assert_eq!(body(encode(&FromAgent::Hello(agent)).unwrap()), [0x00, 0xac, 0x02, 0x03, b'0', b'.', b'1', 0x00]);
        let ready = AgentHello {
            protocol_version: 5,
            agent_version: "v".into(),
            state: AgentState::Ready { sandbox_id: "s".into() },
            offer: Some(Offer { min_version: 4, features: vec![] }),
        };
        assert_eq!(body(encode(&FromAgent::Hello(ready)).unwrap()), [0x00, 0x05, 0x01, b'v', 0x01, 0x01, b's', 0x04, 0x00]);
    }

    #[test]
    fn older_decoders_read_a_new_hello_and_new_decoders_an_old_one() {
        let edge = ToAgent::Hello(EdgeHello::ours(5));
        let old: LegacyToAgent = decode(&encode(&edge).unwrap()[4..]).unwrap();
        assert_eq!(old, LegacyToAgent::Hello { protocol_version: 5 });
        let new: ToAgent = decode(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(new, ToAgent::Hello(EdgeHello { protocol_version: 5, offer: None }));

        let agent = FromAgent::Hello(AgentHello::ours("x", AgentState::Ready { sandbox_id: "sb".into() }));
        let old: LegacyFromAgent = decode(&encode(&agent).unwrap()[4..]).unwrap();
        let LegacyFromAgent::Hello { protocol_version, ref state, .. } = old;
        assert_eq!((protocol_version, state), (PROTOCOL_VERSION, &AgentState::Ready { sandbox_id: "sb".into() }));
        let FromAgent::Hello(new) = decode(&postcard::to_allocvec(&old).unwrap()).unwrap() else { panic!("not a Hello") };
        assert_eq!(new.offer, None);
        assert!(new.speaks().strict);
        // Ours round-trips with its Offer.
        assert_eq!(decode::<FromAgent>(&encode(&agent).unwrap()[4..]).unwrap(), agent);
    }
}
