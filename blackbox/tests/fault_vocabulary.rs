//! Each real-process nemesis injects exactly the kinds the one fault vocabulary
//! (`sut::fault`) lists for it, by the vocabulary's names: a kind added to either side without
//! the other fails here.

use blackbox::ids::BlackBoxFault;
use blackbox::real::Fault;
use chaos::nemesis::ChaosFault;
use sut::fault::{FaultKind, Runner};

fn sorted(mut kinds: Vec<FaultKind>) -> Vec<FaultKind> {
    kinds.sort();
    kinds
}

#[test]
fn the_deployments_chaos_injects_the_vocabularys_deployment_kinds() {
    let ours = sorted(ChaosFault::ALL.iter().map(|f| f.kind()).collect());
    assert_eq!(ours, FaultKind::of(Runner::Deployment).collect::<Vec<_>>());
    for f in ChaosFault::ALL {
        assert_eq!(ChaosFault::parse(f.kind().name()), Ok(f));
    }
    assert_eq!(
        ChaosFault::parse("clock"),
        Ok(ChaosFault::Clock),
        "the older name"
    );
    assert!(
        ChaosFault::parse("swizzle")
            .unwrap_err()
            .contains("simulated")
    );
}

#[test]
fn the_own_service_nemesis_injects_the_vocabularys_own_service_kinds() {
    let ours = sorted(BlackBoxFault::ALL.iter().map(|f| f.kind()).collect());
    assert_eq!(ours, FaultKind::of(Runner::OwnService).collect::<Vec<_>>());
    for f in BlackBoxFault::ALL {
        assert_eq!(BlackBoxFault::parse(f.name()), Ok(f));
    }
    assert_eq!(BlackBoxFault::parse("clock"), Ok(BlackBoxFault::Clock));
    assert!(
        BlackBoxFault::parse("clock_skew")
            .unwrap_err()
            .contains("deployment")
    );
}

#[test]
fn the_real_system_nemesis_injects_the_vocabularys_real_system_kinds() {
    let ours = sorted(Fault::ALL.iter().map(|f| f.kind()).collect());
    assert_eq!(ours, FaultKind::of(Runner::RealSystem).collect::<Vec<_>>());
    for f in Fault::ALL {
        assert_eq!(Fault::parse(f.kind().name()), Ok(f));
    }
}
