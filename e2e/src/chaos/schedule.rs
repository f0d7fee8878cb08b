//! The seeded schedule: one RNG, seeded with `--seed`, draws every churn operation, fault
//! window and process fault, with its time offset from the start of the window, before
//! anything runs. The same seed and sizes give the same schedule (with the `rand` of
//! `Cargo.lock`), whatever the hub does, so a failing seed replays the same run.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::churn::{ChurnOp, Model};
use super::faults::{FaultWindow, ProcessFault, SpokeFault};

/// What the schedule is drawn for.
#[derive(Clone, Debug)]
pub struct ScheduleOptions {
    /// The seed.
    pub seed: u64,
    /// Spokes.
    pub spokes: usize,
    /// Bindings per spoke at the start.
    pub bindings: usize,
    /// The window of churn and faults.
    pub duration: Duration,
    /// Churn operations per second (over the fleet).
    pub churn_per_second: f64,
    /// Mean time between two fault windows of one spoke.
    pub fault_every: Duration,
    /// Process faults (`kill -9`) in the window (alternating leader / both).
    pub process_faults: usize,
    /// Sharded mode: also draw the faults of sharded replicas (`None`: leader mode, whose
    /// schedule for a seed stays what it was before these faults existed).
    pub sharded: Option<ShardedOptions>,
}

/// What the faults of sharded replicas are drawn for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardedOptions {
    /// Hub replicas (at least 2).
    pub replicas: usize,
    /// The replicas' lease duration: partitions and pauses last longer than it, so that
    /// another replica takes the spokes over for a while.
    pub lease: Duration,
}

/// What happens at one moment.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// A churn operation.
    Churn(ChurnOp),
    /// A spoke fault starts.
    FaultStart(FaultWindow),
    /// Every fault of this spoke is cleared.
    FaultEnd(usize),
    /// A process fault.
    Process(ProcessFault),
    /// The end of a [`ProcessFault::HubPartition`] of this replica: its credential is
    /// accepted again.
    PartitionEnd(usize),
}

/// One scheduled action, at `at` from the start of the window.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Offset from the start of the window.
    pub at: Duration,
    /// What.
    pub action: Action,
}

/// The run's plan: events sorted by time, and the ops that restore every deleted profile
/// when churn stops.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Every event, sorted by `at` (stable: equal times keep their drawing order).
    pub events: Vec<Event>,
    /// The profiles to add back at the end of the window.
    pub restore: Vec<ChurnOp>,
}

impl Schedule {
    /// Draws the schedule for `o`.
    pub fn draw(o: &ScheduleOptions) -> Self {
        let mut rng = StdRng::seed_from_u64(o.seed);
        let window = o.duration.as_secs_f64();
        let mut events = Vec::new();

        // Churn: evenly spread with jitter, ops drawn in time order against the model.
        let mut model = Model::initial(o.spokes, o.bindings);
        let ops = (window * o.churn_per_second).round() as usize;
        let mut times: Vec<f64> = (0..ops)
            .map(|i| {
                let slot = window / ops.max(1) as f64;
                (i as f64 + rng.gen_range(0.0..1.0)) * slot
            })
            .collect();
        times.sort_by(f64::total_cmp);
        for t in times {
            events.push(Event {
                at: Duration::from_secs_f64(t),
                action: Action::Churn(model.next_op(&mut rng)),
            });
        }

        // Spoke faults: per spoke, windows of 2-10 s separated by random gaps; the last
        // ends with the window at the latest.
        let every = o.fault_every.as_secs_f64().max(1.0);
        for spoke in 0..o.spokes {
            let mut t = rng.gen_range(0.0..every);
            while t + 1.0 < window {
                let lasts = rng.gen_range(2.0..10.0f64).min(window - t);
                let fault = SpokeFault::random(&mut rng);
                events.push(Event {
                    at: Duration::from_secs_f64(t),
                    action: Action::FaultStart(FaultWindow {
                        spoke,
                        fault,
                        lasts: Duration::from_secs_f64(lasts),
                    }),
                });
                events.push(Event {
                    at: Duration::from_secs_f64(t + lasts),
                    action: Action::FaultEnd(spoke),
                });
                t += lasts + rng.gen_range(0.5..2.0) * every;
            }
        }

        // Process faults: spread over the window, alternating.
        for i in 0..o.process_faults {
            let base = window * (i + 1) as f64 / (o.process_faults + 1) as f64;
            let at = (base + rng.gen_range(-0.05..0.05) * window).clamp(0.0, window);
            let restart_after = Duration::from_secs_f64(rng.gen_range(1.0..5.0));
            let fault = if i % 2 == 0 {
                ProcessFault::KillLeader { restart_after }
            } else {
                ProcessFault::KillBoth { restart_after }
            };
            events.push(Event {
                at: Duration::from_secs_f64(at),
                action: Action::Process(fault),
            });
        }
        // Drawn last, so that a seed draws the same everything else in both modes.
        if let Some(sh) = o.sharded {
            draw_sharded(&mut rng, &mut events, window, sh);
        }
        events.sort_by_key(|e| e.at);
        let restore = model.restore_profiles();
        Schedule { events, restore }
    }
}

/// The faults of sharded replicas: the last replica joins late (in the first quarter of the
/// window), then, at random times, replicas lose their Lease (one per minute, at least 2),
/// are killed for more than a lease duration (one per 5 minutes, at least 1), and are cut
/// from the hub cluster for 2.5-4 lease durations (one per 2.5 minutes, at least 1, one at a
/// time). Faults before the join spare the replica that has not started.
fn draw_sharded(rng: &mut StdRng, events: &mut Vec<Event>, window: f64, sh: ShardedOptions) {
    let n = sh.replicas.max(2);
    let lease = sh.lease.as_secs_f64().max(1.0);
    let joiner = n - 1;
    let join_at = rng.gen_range(0.1..0.25) * window;
    events.push(Event {
        at: Duration::from_secs_f64(join_at),
        action: Action::Process(ProcessFault::Join { replica: joiner }),
    });
    let pick = |rng: &mut StdRng, at: f64| {
        if at < join_at {
            rng.gen_range(0..joiner)
        } else {
            rng.gen_range(0..n)
        }
    };
    let count = |per: f64, min: usize| ((window / per) as usize).max(min);
    for _ in 0..count(60.0, 2) {
        let at = rng.gen_range(0.05..0.95) * window;
        let replica = pick(rng, at);
        events.push(Event {
            at: Duration::from_secs_f64(at),
            action: Action::Process(ProcessFault::LeaseLoss { replica }),
        });
    }
    for _ in 0..count(300.0, 1) {
        let at = rng.gen_range(0.3..0.9) * window;
        let replica = pick(rng, at);
        let restart_after = Duration::from_secs_f64(lease * rng.gen_range(2.5..5.0));
        events.push(Event {
            at: Duration::from_secs_f64(at),
            action: Action::Process(ProcessFault::KillPause {
                replica,
                restart_after,
            }),
        });
    }
    // One partition per slot of the window, each within its slot: never two at once.
    let partitions = count(150.0, 1);
    let slot = window / partitions as f64;
    for i in 0..partitions {
        let lasts = (lease * rng.gen_range(2.5..4.0)).min(slot * 0.8);
        let at = i as f64 * slot + rng.gen_range(0.0..(slot - lasts).max(0.001));
        let replica = pick(rng, at);
        events.push(Event {
            at: Duration::from_secs_f64(at),
            action: Action::Process(ProcessFault::HubPartition {
                replica,
                lasts: Duration::from_secs_f64(lasts),
            }),
        });
        events.push(Event {
            at: Duration::from_secs_f64(at + lasts),
            action: Action::PartitionEnd(replica),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64) -> ScheduleOptions {
        ScheduleOptions {
            seed,
            spokes: 4,
            bindings: 5,
            duration: Duration::from_secs(60),
            churn_per_second: 5.0,
            fault_every: Duration::from_secs(10),
            process_faults: 2,
            sharded: None,
        }
    }

    #[test]
    fn a_seed_gives_one_schedule_and_another_seed_another() {
        let a = Schedule::draw(&options(7));
        let b = Schedule::draw(&options(7));
        let c = Schedule::draw(&options(8));
        assert_eq!(a.events, b.events);
        assert_ne!(a.events, c.events);
        let churn = a
            .events
            .iter()
            .filter(|e| matches!(e.action, Action::Churn(_)))
            .count();
        assert_eq!(churn, 300);
        assert!(a.events.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a.events.iter().all(|e| e.at <= Duration::from_secs(60)));
    }

    #[test]
    fn every_fault_window_is_closed_within_the_window() {
        let s = Schedule::draw(&options(3));
        for spoke in 0..4 {
            let mut open = 0i32;
            for e in &s.events {
                match &e.action {
                    Action::FaultStart(w) if w.spoke == spoke => open += 1,
                    Action::FaultEnd(x) if *x == spoke => open -= 1,
                    _ => {}
                }
                assert!((0..=1).contains(&open), "overlapping windows on {spoke}");
            }
            assert_eq!(open, 0, "spoke {spoke} ends with a fault on");
        }
        let kills = s
            .events
            .iter()
            .filter(|e| matches!(e.action, Action::Process(_)))
            .count();
        assert_eq!(kills, 2);
    }

    fn is_sharded_fault(a: &Action) -> bool {
        matches!(
            a,
            Action::PartitionEnd(_)
                | Action::Process(
                    ProcessFault::Join { .. }
                        | ProcessFault::KillPause { .. }
                        | ProcessFault::LeaseLoss { .. }
                        | ProcessFault::HubPartition { .. }
                )
        )
    }

    /// Sharded mode adds its faults to the leader-mode schedule of the same seed and
    /// changes nothing else in it (a leader-mode seed replays as before).
    #[test]
    fn sharded_faults_are_added_to_the_same_schedule() {
        let leader = Schedule::draw(&options(11));
        let mut o = options(11);
        o.sharded = Some(ShardedOptions {
            replicas: 3,
            lease: Duration::from_secs(4),
        });
        let sharded = Schedule::draw(&o);
        let rest: Vec<&Event> = sharded
            .events
            .iter()
            .filter(|e| !is_sharded_fault(&e.action))
            .collect();
        assert_eq!(rest, leader.events.iter().collect::<Vec<_>>());
        assert!(!leader.events.iter().any(|e| is_sharded_fault(&e.action)));

        let mut join_at = None;
        let mut open: Option<usize> = None;
        let (mut losses, mut pauses, mut partitions) = (0, 0, 0);
        for e in &sharded.events {
            match &e.action {
                Action::Process(ProcessFault::Join { replica }) => {
                    assert_eq!(*replica, 2);
                    assert!(join_at.replace(e.at).is_none(), "two joins");
                }
                Action::Process(ProcessFault::LeaseLoss { replica }) => {
                    losses += 1;
                    assert!(*replica < 3);
                    assert!(join_at.is_some() || *replica != 2, "{e:?} before the join");
                }
                Action::Process(ProcessFault::KillPause {
                    replica,
                    restart_after,
                }) => {
                    pauses += 1;
                    assert!(join_at.is_some() || *replica != 2, "{e:?} before the join");
                    assert!(*restart_after > Duration::from_secs(4));
                }
                Action::Process(ProcessFault::HubPartition { replica, lasts }) => {
                    partitions += 1;
                    assert!(join_at.is_some() || *replica != 2, "{e:?} before the join");
                    assert!(open.replace(*replica).is_none(), "two partitions at once");
                    assert!(*lasts > Duration::from_secs(4));
                }
                Action::PartitionEnd(replica) => {
                    assert_eq!(open.take(), Some(*replica));
                }
                _ => {}
            }
        }
        assert!(join_at.is_some());
        assert_eq!(open, None, "a partition left open");
        assert_eq!((losses, pauses, partitions), (2, 1, 1));
        assert!(
            sharded
                .events
                .iter()
                .all(|e| e.at <= Duration::from_secs(60))
        );
    }
}
