//! Results: a table for people, JSON and JUnit XML for machines.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What became of one case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Failed(String),
    /// The implementation does not claim it (v2 on a legacy server): not a
    /// failure.
    NotOffered(String),
    /// Not run here (it needs an option: a short session TTL, ...).
    Skipped(String),
}

impl Outcome {
    pub fn word(&self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed(_) => "FAILED",
            Self::NotOffered(_) => "not offered",
            Self::Skipped(_) => "skipped",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            Self::Passed => "",
            Self::Failed(d) | Self::NotOffered(d) | Self::Skipped(d) => d,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// `server.fast_connect.wrong_device`, ...
    pub id: String,
    /// The spec section it checks (`mpush-wire.md 5.5`, or an ADR).
    pub spec: String,
    pub title: String,
    /// `tcp`, `ws`, or the client's adapter.
    pub over: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    pub millis: u64,
}

/// A case: its id, the spec section it checks, what it checks.
pub type Case = (&'static str, &'static str, &'static str);

/// Runs `cases` (those whose id starts with one of `only`; all when it is
/// empty), each within `budget`, and names their results `{mode}.{id}` over
/// `over`. `case` runs one by id; an `Err` is a failure in words.
pub async fn run_cases<F, Fut>(
    cases: &[Case],
    mode: &str,
    over: &str,
    only: &[String],
    budget: Duration,
    case: F,
) -> Vec<CaseResult>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Result<Outcome, String>>,
{
    let mut out = Vec::new();
    for &(id, spec, title) in cases {
        if !only.is_empty() && !only.iter().any(|o| id.starts_with(o.as_str())) {
            continue;
        }
        let started = Instant::now();
        let outcome = match tokio::time::timeout(budget, case(id)).await {
            Ok(Ok(o)) => o,
            Ok(Err(why)) => Outcome::Failed(why),
            Err(_) => Outcome::Failed(format!("the case did not end within {budget:?}")),
        };
        out.push(CaseResult {
            id: format!("{mode}.{id}"),
            spec: spec.to_owned(),
            title: title.to_owned(),
            over: over.to_owned(),
            outcome,
            millis: started.elapsed().as_millis() as u64,
        });
    }
    out
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// What was tested: an address, or a client command.
    pub subject: String,
    pub results: Vec<CaseResult>,
}

/// Counts: passed, failed, not offered, skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    pub not_offered: usize,
    pub skipped: usize,
}

impl Report {
    pub fn push(&mut self, r: CaseResult) {
        self.results.push(r);
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for r in &self.results {
            match r.outcome {
                Outcome::Passed => c.passed += 1,
                Outcome::Failed(_) => c.failed += 1,
                Outcome::NotOffered(_) => c.not_offered += 1,
                Outcome::Skipped(_) => c.skipped += 1,
            }
        }
        c
    }

    /// The result of `id` over `over`.
    pub fn get(&self, id: &str, over: &str) -> Option<&CaseResult> {
        self.results.iter().find(|r| r.id == id && r.over == over)
    }

    /// A fixed-width table, one case per line, then the counts.
    pub fn table(&self) -> String {
        let w = self
            .results
            .iter()
            .map(|r| r.id.len())
            .max()
            .unwrap_or(10)
            .max(10);
        let o = self
            .results
            .iter()
            .map(|r| r.over.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let mut out = format!(
            "{:<w$}  {:<o$}  {:<11}  {:<26}  detail\n",
            "case", "over", "result", "spec"
        );
        for r in &self.results {
            out.push_str(&format!(
                "{:<w$}  {:<o$}  {:<11}  {:<26}  {}\n",
                r.id,
                r.over,
                r.outcome.word(),
                r.spec,
                r.outcome.detail()
            ));
        }
        let c = self.counts();
        out.push_str(&format!(
            "{}: {} passed, {} failed, {} not offered, {} skipped\n",
            self.subject, c.passed, c.failed, c.not_offered, c.skipped
        ));
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "subject": self.subject,
            "counts": self.counts(),
            "results": self.results,
        }))
        .unwrap_or_default()
    }

    /// Writes the table, JSON and JUnit XML as `dir/name.{txt,json,xml}`.
    pub fn save(&self, dir: &std::path::Path, name: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("{name}.txt")), self.table())?;
        std::fs::write(dir.join(format!("{name}.json")), self.json())?;
        std::fs::write(dir.join(format!("{name}.xml")), self.junit())
    }

    /// JUnit XML: one test suite per transport or adapter; "not offered"
    /// and "skipped" are skipped tests with the reason.
    pub fn junit(&self) -> String {
        use quick_junit::{NonSuccessKind, Report as JReport, TestCase, TestCaseStatus, TestSuite};
        let mut report = JReport::new("mpush-conformance");
        let mut overs: Vec<&str> = self.results.iter().map(|r| r.over.as_str()).collect();
        overs.dedup();
        overs.sort();
        overs.dedup();
        for over in overs {
            let mut suite = TestSuite::new(format!("{} ({over})", self.subject));
            for r in self.results.iter().filter(|r| r.over == over) {
                let status = match &r.outcome {
                    Outcome::Passed => TestCaseStatus::success(),
                    Outcome::Failed(d) => {
                        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                        s.set_message(d.clone());
                        s
                    }
                    Outcome::NotOffered(d) | Outcome::Skipped(d) => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_message(format!("{}: {d}", r.outcome.word()));
                        s
                    }
                };
                let mut case = TestCase::new(format!("{} [{}]", r.id, r.spec), status);
                case.set_classname(over.to_owned());
                case.set_time(Duration::from_millis(r.millis));
                suite.add_test_case(case);
            }
            report.add_test_suite(suite);
        }
        report.to_string().unwrap_or_default()
    }
}
