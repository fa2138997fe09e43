//! The fault vocabulary, written once: for each [`FaultKind`], the space its parameters are
//! drawn from ([`space`]) and how drawn values make a [`ScheduledFault`] ([`FaultSpace::event`]).
//!
//! Two users draw from it: the random nemesis (one draw per injection, from the seed's RNG,
//! [`FaultSpace::draw`]) and the schedule search in `scenarios` (a proptest strategy per
//! parameter, so that shrinking simplifies each one). Both then carry the event out the same
//! way (`nemesis`'s scripted path), so a fault the search finds is a fault the random nemesis
//! can inject, with the same ranges.

use madsim::rand::Rng;

use crate::scenario::{FaultKind, Faults, ScheduledFault};

/// Where faults can strike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// Every node (network faults: partition sides, swizzled nodes).
    pub all: Vec<String>,
    /// The server nodes node faults may hit (kill, pause, clocks).
    pub servers: Vec<String>,
}

impl Targets {
    /// The ID nodes among the servers (a clock restart's targets).
    #[must_use]
    pub fn id_nodes(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|n| n.starts_with("id"))
            .cloned()
            .collect()
    }
}

/// One parameter of a fault kind and the range it is drawn from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    /// One node of the list.
    Node(Vec<String>),
    /// A subset of the list with `min..=max` members, in list order.
    Nodes {
        /// The candidates.
        of: Vec<String>,
        /// Fewest members.
        min: usize,
        /// Most members.
        max: usize,
    },
    /// Yes or no.
    Flag,
    /// An integer in `lo..=hi`.
    Int {
        /// Smallest.
        lo: i64,
        /// Largest.
        hi: i64,
    },
    /// A magnitude in `1..=max`, log-uniform (millisecond clock bumps as often as minute-long
    /// ones): drawn as `x` in `0..=1000` and mapped to `round(max^(x / 1000))`, so shrinking `x`
    /// shrinks the magnitude towards 1.
    LogMagnitude {
        /// Largest.
        max: i64,
    },
}

/// What a parameter sets in the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// How long the fault lasts (`clock_restart`: how long the node stays down).
    DurationMs,
    /// [`ScheduledFault::node`].
    Node,
    /// [`ScheduledFault::nodes`].
    Nodes,
    /// [`ScheduledFault::one_way`].
    OneWay,
    /// [`ScheduledFault::tear`].
    Tear,
    /// [`ScheduledFault::delta_ms`].
    DeltaMs,
    /// The sign of [`ScheduledFault::delta_ms`] (set after it): `true` forward.
    Forward,
    /// [`ScheduledFault::period_ms`].
    PeriodMs,
    /// [`ScheduledFault::ppm`].
    Ppm,
    /// [`ScheduledFault::loss_pct`].
    LossPct,
    /// [`ScheduledFault::latency_ms`].
    LatencyMs,
}

/// A drawn value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// For [`Param::Node`].
    Node(String),
    /// For [`Param::Nodes`].
    Nodes(Vec<String>),
    /// For [`Param::Flag`].
    Flag(bool),
    /// For [`Param::Int`] and [`Param::LogMagnitude`] (already mapped).
    Int(i64),
}

/// The parameters of one fault kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpace {
    /// The kind.
    pub kind: FaultKind,
    /// Its parameters, in the order they are drawn.
    pub params: Vec<(Field, Param)>,
}

/// The parameter space of `kind` for a scenario's `[faults]` settings and targets; `None`
/// when the targets leave it nothing to hit.
#[must_use]
pub fn space(kind: FaultKind, faults: &Faults, targets: &Targets) -> Option<FaultSpace> {
    let duration = (
        Field::DurationMs,
        int(faults.down_ms.min_ms.max(1), faults.down_ms.max_ms.max(1)),
    );
    let node = || {
        (!targets.servers.is_empty()).then(|| (Field::Node, Param::Node(targets.servers.clone())))
    };
    let params = match kind {
        FaultKind::Partition | FaultKind::Swizzle | FaultKind::Loss | FaultKind::Latency => {
            network_params(kind, faults, targets, duration)?
        }
        FaultKind::Kill => vec![duration, node()?, (Field::Tear, Param::Flag)],
        FaultKind::Pause => vec![duration, node()?],
        FaultKind::ClockBump => {
            let max = i64::try_from(faults.bump_ms_max.clamp(2, 3_600_000)).unwrap_or(2);
            vec![
                node()?,
                (Field::DeltaMs, Param::LogMagnitude { max }),
                (Field::Forward, Param::Flag),
            ]
        }
        FaultKind::ClockStrobe => vec![
            duration,
            node()?,
            (Field::DeltaMs, int(2, 1_999)),
            (Field::PeriodMs, int(5, 99)),
        ],
        FaultKind::ClockDrift => {
            let ppm = faults.drift_ppm_max.clamp(1, 1_000_000);
            vec![
                duration,
                node()?,
                (Field::Ppm, Param::Int { lo: -ppm, hi: ppm }),
            ]
        }
        FaultKind::ClockRestart => {
            let ids = targets.id_nodes();
            if ids.is_empty() {
                return None;
            }
            vec![
                (Field::DurationMs, int(10, 99)),
                (Field::Node, Param::Node(ids)),
                (Field::DeltaMs, int(10, 4_999)),
                (Field::Tear, Param::Flag),
            ]
        }
    };
    Some(FaultSpace { kind, params })
}

/// The parameters of a network fault (partition, swizzle, loss, latency); `None` when there
/// are too few nodes.
fn network_params(
    kind: FaultKind,
    faults: &Faults,
    targets: &Targets,
    duration: (Field, Param),
) -> Option<Vec<(Field, Param)>> {
    Some(match kind {
        FaultKind::Partition => {
            if targets.all.len() < 2 {
                return None;
            }
            let side = nodes(&targets.all, 1, targets.all.len() - 1);
            vec![duration, (Field::Nodes, side), (Field::OneWay, Param::Flag)]
        }
        FaultKind::Swizzle => {
            if targets.all.is_empty() {
                return None;
            }
            let clogged = nodes(&targets.all, 1, targets.all.len());
            vec![
                duration,
                (Field::Nodes, clogged),
                (Field::PeriodMs, int(20, 199)),
            ]
        }
        FaultKind::Loss => {
            let pct = u64::from(faults.loss_pct_max.clamp(1, 100));
            vec![duration, (Field::LossPct, int(1, pct))]
        }
        FaultKind::Latency => vec![duration, (Field::LatencyMs, int(50, 499))],
        _ => return None, // not a network fault
    })
}

fn int(lo: u64, hi: u64) -> Param {
    let lo = i64::try_from(lo).unwrap_or(i64::MAX);
    Param::Int {
        lo,
        hi: i64::try_from(hi).unwrap_or(i64::MAX).max(lo),
    }
}

fn nodes(of: &[String], min: usize, max: usize) -> Param {
    Param::Nodes {
        of: of.to_vec(),
        min,
        max: max.max(min),
    }
}

/// `round(max^(x / 1000))` for `x` in `0..=1000`: 1 at 0, `max` at 1000.
#[must_use]
pub fn log_magnitude(max: i64, x: i64) -> i64 {
    debug_assert!((0..=1000).contains(&x), "x {x} outside 0..=1000");
    (max.max(1) as f64).powf(x as f64 / 1_000.0).round() as i64
}

impl FaultSpace {
    /// One random draw of every parameter, from the simulation's RNG.
    pub fn draw(&self, rng: &mut impl Rng, at_ms: u64) -> ScheduledFault {
        let values = self
            .params
            .iter()
            .map(|(_, param)| draw_value(param, rng))
            .collect::<Vec<_>>();
        self.event(at_ms, &values)
    }

    /// The event `values` (one per parameter, in order) describe.
    #[must_use]
    pub fn event(&self, at_ms: u64, values: &[Value]) -> ScheduledFault {
        assert_eq!(values.len(), self.params.len(), "one value per parameter");
        let mut event = ScheduledFault::new(at_ms, self.kind);
        for ((field, _), value) in self.params.iter().zip(values) {
            set(&mut event, *field, value);
        }
        event
    }
}

fn draw_value(param: &Param, rng: &mut impl Rng) -> Value {
    match param {
        Param::Node(of) => Value::Node(of[rng.gen_range(0..of.len())].clone()),
        Param::Nodes { of, min, max } => {
            let size = rng.gen_range(*min..=*max);
            let mut chosen: Vec<usize> = (0..of.len()).collect();
            // A partial Fisher-Yates shuffle: the first `size` are a uniform subset.
            for i in 0..size {
                let j = rng.gen_range(i..chosen.len());
                chosen.swap(i, j);
            }
            chosen.truncate(size);
            chosen.sort_unstable();
            Value::Nodes(chosen.into_iter().map(|i| of[i].clone()).collect())
        }
        Param::Flag => Value::Flag(rng.gen_bool(0.5)),
        Param::Int { lo, hi } => Value::Int(rng.gen_range(*lo..=*hi)),
        Param::LogMagnitude { max } => Value::Int(log_magnitude(*max, rng.gen_range(0..=1000))),
    }
}

fn set(event: &mut ScheduledFault, field: Field, value: &Value) {
    let int = || match value {
        Value::Int(v) => *v,
        other => unreachable!("{field:?} takes an integer, not {other:?}"),
    };
    let flag = || matches!(value, Value::Flag(true));
    let unsigned = |v: i64| u64::try_from(v.max(0)).unwrap_or(0);
    match field {
        Field::DurationMs => event.down_ms = Some(unsigned(int())),
        Field::Node => {
            if let Value::Node(n) = value {
                event.node = Some(n.clone());
            }
        }
        Field::Nodes => {
            if let Value::Nodes(ns) = value {
                event.nodes.clone_from(ns);
            }
        }
        Field::OneWay => event.one_way = flag(),
        Field::Tear => event.tear = flag(),
        Field::DeltaMs => event.delta_ms = Some(int()),
        Field::Forward => {
            let magnitude = event.delta_ms.unwrap_or(0).abs();
            event.delta_ms = Some(if flag() { magnitude } else { -magnitude });
        }
        Field::PeriodMs => event.period_ms = Some(unsigned(int())),
        Field::Ppm => event.ppm = Some(int()),
        Field::LossPct => event.loss_pct = Some(u32::try_from(unsigned(int())).unwrap_or(100)),
        Field::LatencyMs => event.latency_ms = Some(unsigned(int())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            all: ["db", "id1", "id2", "token", "client1"]
                .map(String::from)
                .to_vec(),
            servers: ["db", "id1", "id2", "token"].map(String::from).to_vec(),
        }
    }

    #[test]
    fn every_kind_has_a_space_and_draws_events_inside_it() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(7, madsim::Config::default());
        runtime.block_on(async { draws_stay_inside_their_space() });
    }

    fn draws_stay_inside_their_space() {
        let faults = Faults::default();
        let mut rng = madsim::rand::thread_rng();
        for kind in FaultKind::ALL {
            let space = space(kind, &faults, &targets()).expect("a target for every kind");
            for _ in 0..200 {
                let e = space.draw(&mut rng, 5);
                assert_eq!((e.fault, e.at_ms), (kind, 5));
                if let Some(node) = &e.node {
                    assert!(targets().servers.contains(node), "{node}");
                }
                assert!(e.nodes.iter().all(|n| targets().all.contains(n)));
                match kind {
                    FaultKind::Partition => {
                        assert!(!e.nodes.is_empty() && e.nodes.len() < targets().all.len());
                    }
                    FaultKind::ClockBump => {
                        let d = e.delta_ms.unwrap().abs();
                        assert!((1..=288_000).contains(&d), "{d}");
                        assert_eq!(e.down_ms, None, "a bump is instantaneous");
                    }
                    FaultKind::ClockRestart => {
                        assert!(e.node.as_deref().unwrap().starts_with("id"));
                        assert!((10..100).contains(&e.down_ms.unwrap()));
                    }
                    FaultKind::Loss => assert!((1..=30).contains(&e.loss_pct.unwrap())),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn node_faults_need_a_target() {
        let none = Targets {
            all: vec!["db".into()],
            servers: Vec::new(),
        };
        let faults = Faults::default();
        assert_eq!(space(FaultKind::Kill, &faults, &none), None);
        assert_eq!(
            space(FaultKind::Partition, &faults, &none),
            None,
            "one node has no sides"
        );
        assert!(space(FaultKind::Loss, &faults, &none).is_some());
    }

    #[test]
    fn the_log_magnitude_spans_1_to_max() {
        assert_eq!(log_magnitude(288_000, 0), 1);
        assert_eq!(log_magnitude(288_000, 1000), 288_000);
        assert!(log_magnitude(288_000, 500) < 1_000);
    }
}
