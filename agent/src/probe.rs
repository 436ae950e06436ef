//! Results of `floe check` steps, shared by the stages that can probe their systems.

/// How one step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It worked.
    Pass,
    /// It failed; the agent would not run.
    Fail,
    /// Not applicable, or not possible because an earlier step failed.
    Skip,
}

/// One probed step: `catalog`, `token`, `namespaces`, `table`, `storage`, `broker`, `topics`...
#[derive(Debug, Clone)]
pub struct Step {
    /// The step's name.
    pub step: &'static str,
    /// Result.
    pub outcome: Outcome,
    /// What was found, or why it failed.
    pub detail: String,
}

/// Collects steps as they are probed.
#[derive(Debug, Default)]
pub struct Steps(pub Vec<Step>);

impl Steps {
    /// Records one step.
    pub fn report(&mut self, step: &'static str, outcome: Outcome, detail: String) {
        self.0.push(Step {
            step,
            outcome,
            detail,
        });
    }
}
