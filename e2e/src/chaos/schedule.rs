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
        events.sort_by_key(|e| e.at);
        let restore = model.restore_profiles();
        Schedule { events, restore }
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
}
