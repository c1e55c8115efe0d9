//! The checker: reads a fault's history and states what it cost. A push
//! answered 2xx must reach its app (after the fault healed, within the
//! quiescence bound); an app must not see a push twice (after the SDK's
//! dedup); a 2xx push that did not arrive must at least be reported failed
//! by its trace; an up-push the SDK says was accepted must reach the
//! backend, and every copy of one message must carry one event id.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::cluster::API_TOKEN;
use crate::load::History;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    pub fault: String,
    pub what: String,
    /// Why it did not run here, if it did not.
    pub skipped: Option<String>,
    pub pushes: usize,
    pub answered_2xx: usize,
    pub answered_404: usize,
    pub answered_503: usize,
    /// 409 in_progress after 30 s of retries (neither sent nor refused, as far as the backend knows).
    pub answered_409: usize,
    /// No answer at all after the retries (the push may or may not have happened).
    pub unanswered: usize,
    pub answered_other: usize,
    /// Pushes the backend had to send again (a 503, or no answer).
    pub retried: usize,
    /// Answered 2xx, never seen by the app.
    pub lost: usize,
    /// Of those, the ones no trace reported failed (a wrong 2xx).
    pub wrong_2xx: usize,
    /// Pushes an app saw more than once.
    pub duplicates: usize,
    pub ups_acked: usize,
    pub ups_lost: usize,
    /// Up-push messages that reached the backend under two event ids.
    pub ups_two_ids: usize,
    pub broadcasts: u64,
    /// From the heal (or the fault, for one that does not heal) until a push
    /// to every user reached a connection again.
    pub recovery_ms: Option<u64>,
    /// How long it took every accepted push to arrive after the load stopped.
    pub settle_ms: u64,
    pub examples: Vec<String>,
}

impl Outcome {
    pub fn failed(&self) -> bool {
        self.skipped.is_none()
            && (self.lost > 0
                || self.wrong_2xx > 0
                || self.duplicates > 0
                || self.ups_lost > 0
                || self.ups_two_ids > 0)
    }
}

/// Counts what `h` shows; `apis` to read traces of the pushes that did not arrive.
pub async fn check(
    fault: &str,
    what: &str,
    h: &History,
    apis: &[String],
    settle: Duration,
) -> Outcome {
    let mut o = Outcome {
        fault: fault.to_owned(),
        what: what.to_owned(),
        pushes: h.pushes.len(),
        broadcasts: h.broadcasts_accepted,
        settle_ms: settle.as_millis() as u64,
        ..Outcome::default()
    };
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for (user, msgs) in &h.seen {
        for m in msgs {
            *seen.entry((user.as_str(), m.as_str())).or_default() += 1;
        }
    }
    let http = reqwest::Client::new();
    for p in &h.pushes {
        if p.tries > 1 {
            o.retried += 1;
        }
        match p.status {
            200..=299 => o.answered_2xx += 1,
            404 => o.answered_404 += 1,
            503 => o.answered_503 += 1,
            409 => o.answered_409 += 1,
            0 => o.unanswered += 1,
            _ => {
                o.answered_other += 1;
                if o.examples.len() < 5 {
                    o.examples.push(format!(
                        "{} to {} answered {} {}",
                        p.content, p.user, p.status, p.body
                    ));
                }
            }
        }
        let n = seen
            .get(&(p.user.as_str(), p.content.as_str()))
            .copied()
            .unwrap_or(0);
        if n > 1 {
            o.duplicates += 1;
            if o.examples.len() < 5 {
                o.examples
                    .push(format!("{} seen {n} times by {}", p.content, p.user));
            }
        }
        if (200..300).contains(&p.status) && n == 0 {
            o.lost += 1;
            let reported = match p.body["traceId"].as_str() {
                Some(t) => trace_reports_failure(&http, apis, t).await,
                None => false,
            };
            if !reported {
                o.wrong_2xx += 1;
            }
            if o.examples.len() < 5 {
                o.examples.push(format!(
                    "{} ({:?}) to {} answered {} {} and never arrived{}",
                    p.content,
                    p.mode,
                    p.user,
                    p.status,
                    p.body,
                    if reported {
                        " (its trace says it failed)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    o.ups_acked = h.ups_acked.len();
    let mut ids: HashMap<&str, HashSet<&str>> = HashMap::new();
    for (id, content) in &h.ups_received {
        ids.entry(content.as_str()).or_default().insert(id.as_str());
    }
    for c in &h.ups_acked {
        if !ids.contains_key(c.as_str()) {
            o.ups_lost += 1;
            if o.examples.len() < 5 {
                o.examples.push(format!(
                    "up-push {c} acknowledged, never received by the backend"
                ));
            }
        }
    }
    o.ups_two_ids = ids.values().filter(|s| s.len() > 1).count();
    o
}

async fn trace_reports_failure(http: &reqwest::Client, apis: &[String], trace: &str) -> bool {
    for api in apis {
        let Ok(r) = http
            .get(format!("{api}/api/v1/traces/{trace}"))
            .bearer_auth(API_TOKEN)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<Value>().await else {
            continue;
        };
        return v["recipients"].as_array().is_some_and(|rs| {
            rs.iter()
                .any(|r| matches!(r["state"].as_str(), Some("FAILED" | "TIMEOUT" | "OFFLINE")))
        });
    }
    false
}

/// The report: one table row per fault, then what each run showed.
pub fn markdown(outcomes: &[Outcome], command: &str, isolated: bool) -> String {
    let mut s = String::new();
    s.push_str("# Delivery under faults\n\n");
    s.push_str(&format!(
        "Generated by `{command}` (the `mpush-faults` crate). Three mpush-server nodes and one redis-server (a Sentinel group for redis-failover) as real processes{}; \
         one sdk-core app per user (24 users, 8 starting on each node); a backend that pushes through every node's API \
         (ACK modes auto and biz, and a 10-minute TTL without one, every 40 ms, each with an Idempotency-Key and retried \
         on a 503, a 409 in_progress or no answer for up to 30 s, through another node each time), broadcasts every 3 s, \
         an up-push from every app every 2 s to a webhook receiver. Each fault runs on a fresh cluster: load, the fault, \
         the heal, then every accepted push must arrive. The columns: `lost` counts pushes answered 2xx that no app saw \
         within 20 s of the load's end; `wrong 2xx` those of them no trace reports failed; `seen twice` pushes an app \
         saw twice after the SDK's dedup; `up-pushes lost` up-pushes the SDK saw accepted that the webhook never got; \
         `two ids` up-push messages that reached the webhook under two event ids; `recovery` the time from the heal \
         until a push to every user reaches a connection again; `all arrived after` the time after the load's end \
         until every accepted push had arrived.\n\n",
        if isolated {
            ", each in its own network namespace on a bridge (partitions are blackhole routes, a lossy link is the link going down in bursts: this kernel has no netem)"
        } else {
            " on loopback addresses (no namespaces here: the partition and link faults were skipped)"
        }
    ));
    s.push_str("| fault | pushes | 2xx | retried | 503 (final) | 409 (final) | no answer | lost (2xx, never arrived) | wrong 2xx | seen twice | up-pushes acked | up-pushes lost | two ids | broadcasts | recovery | all arrived after |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for o in outcomes {
        if let Some(why) = &o.skipped {
            s.push_str(&format!("| {} | skipped: {why} |||||||||||||||\n", o.fault));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | **{}** | **{}** | **{}** | {} | **{}** | **{}** | {} | {} | {} |\n",
            o.fault,
            o.pushes,
            o.answered_2xx,
            o.retried,
            o.answered_503,
            o.answered_409,
            o.unanswered,
            o.lost,
            o.wrong_2xx,
            o.duplicates,
            o.ups_acked,
            o.ups_lost,
            o.ups_two_ids,
            o.broadcasts,
            o.recovery_ms.map_or("–".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
            if o.lost > 0 {
                "never (20 s bound)".to_owned()
            } else {
                format!("{:.1} s", o.settle_ms as f64 / 1000.0)
            },
        ));
    }
    s.push_str("\nThe faults:\n\n");
    for o in outcomes {
        s.push_str(&format!("- **{}**: {}\n", o.fault, o.what));
        for e in &o.examples {
            s.push_str(&format!("  - {e}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Mode, PushRecord};
    use serde_json::json;

    fn push(content: &str, user: &str, status: u16) -> PushRecord {
        PushRecord {
            content: content.into(),
            user: user.into(),
            mode: Mode::Biz,
            status,
            body: json!({"status": "sent"}),
            tries: 1,
        }
    }

    /// The checker finds each kind of failure it reports, and passes a clean history.
    #[tokio::test]
    async fn it_counts_what_it_claims() {
        let mut h = History {
            pushes: vec![
                push("p1", "u1", 200), // arrived once
                push("p2", "u1", 200), // never arrived, no trace: lost and a wrong 2xx
                push("p3", "u2", 200), // arrived twice
                push("p4", "u2", 503), // refused: need not arrive
            ],
            ..History::default()
        };
        h.pushes[1].tries = 3;
        h.seen.insert("u1".into(), vec!["p1".into()]);
        h.seen.insert("u2".into(), vec!["p3".into(), "p3".into()]);
        h.ups_acked = vec!["up1".into(), "up2".into(), "up3".into()];
        h.ups_received = vec![
            ("e1".into(), "up1".into()),
            ("e2".into(), "up2".into()),
            ("e9".into(), "up2".into()), // the same message under two ids
        ];
        let o = check("x", "y", &h, &[], Duration::ZERO).await;
        assert_eq!(
            (o.pushes, o.answered_2xx, o.answered_503, o.retried),
            (4, 3, 1, 1)
        );
        assert_eq!((o.lost, o.wrong_2xx, o.duplicates), (1, 1, 1));
        assert_eq!((o.ups_acked, o.ups_lost, o.ups_two_ids), (3, 1, 1));
        assert!(o.failed());
        let md = markdown(&[o], "cmd", true);
        assert!(
            md.contains(
                "| x | 4 | 3 | 1 | 1 | 0 | 0 | **1** | **1** | **1** | 3 | **1** | **1** |"
            ),
            "{md}"
        );

        let mut clean = History {
            pushes: vec![push("p1", "u1", 200), push("p2", "u1", 503)],
            ..History::default()
        };
        clean.seen.insert("u1".into(), vec!["p1".into()]);
        clean.ups_acked = vec!["up1".into()];
        clean.ups_received = vec![("e1".into(), "up1".into()), ("e1".into(), "up1".into())];
        let o = check("x", "y", &clean, &[], Duration::ZERO).await;
        assert!(!o.failed(), "{o:?}");
    }

    /// A skipped fault neither passes nor fails, and says why.
    #[test]
    fn a_skipped_fault_says_why() {
        let o = Outcome {
            fault: "nodes-cut".into(),
            skipped: Some("needs network namespaces (root)".into()),
            lost: 3,
            ..Outcome::default()
        };
        assert!(!o.failed());
        assert!(
            markdown(&[o], "cmd", false)
                .contains("| nodes-cut | skipped: needs network namespaces (root)")
        );
    }
}
