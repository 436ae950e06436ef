//! The one retry mechanism of Floe. A [`Policy`] says how many attempts an operation
//! gets and how long to wait between them (capped exponential backoff with jitter);
//! [`Attempts`] counts one operation's failures. Whether a failure is retried at all is
//! its [`ErrorClass`]: only transient failures are. The caller chooses where it waits (a
//! task, a blocking thread, a wait that a shutdown cuts short), or uses [`retry`].

use std::future::Future;
use std::time::Duration;

use crate::error::ErrorClass;

/// How often an operation is tried and how long to wait between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    base: Duration,
    cap: Duration,
    attempts: u32,
}

impl Policy {
    /// Waits of about `base` after the first failure, doubling up to `cap`; attempts
    /// are unbounded until [`Policy::attempts`] bounds them.
    pub const fn backoff(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempts: u32::MAX,
        }
    }

    /// No wait between attempts: for failures that nothing outside caused, such as a
    /// stale table view that a reload fixes.
    pub const fn immediate() -> Self {
        Self::backoff(Duration::ZERO, Duration::ZERO)
    }

    /// At most `n` attempts in all: the first and `n - 1` retries.
    pub const fn attempts(self, n: u32) -> Self {
        Self {
            attempts: n,
            ..self
        }
    }

    /// The attempts of one operation under this policy.
    pub fn start(self) -> Attempts {
        Attempts {
            policy: self,
            failures: 0,
        }
    }

    /// The wait after failure number `failure` (1 is the first): about `base`, doubling
    /// up to `cap`, spread over its upper half so that writers who collided do not
    /// collide again.
    pub fn wait(&self, failure: u32) -> Duration {
        if self.cap.is_zero() {
            return Duration::ZERO;
        }
        let ms = (self.base.as_millis() as u64)
            .saturating_mul(1 << failure.saturating_sub(1).min(16))
            .min(self.cap.as_millis() as u64)
            .max(1);
        let jitter = u64::from(uuid::Uuid::new_v4().as_u128() as u16) % (ms / 2 + 1);
        Duration::from_millis(ms / 2 + jitter)
    }
}

/// The failures of one operation so far, under its [`Policy`].
#[derive(Debug, Clone)]
pub struct Attempts {
    policy: Policy,
    failures: u32,
}

impl Attempts {
    /// Records a failure of class `class`: the wait before the next attempt, or `None`
    /// when the failure is fatal or the policy's attempts are spent.
    pub fn retry_after(&mut self, class: impl Into<ErrorClass>) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        (class.into() == ErrorClass::Transient && self.failures < self.policy.attempts)
            .then(|| self.policy.wait(self.failures))
    }

    /// Failures recorded so far: the number of the attempt that failed last.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Forgets the failures (the operation succeeded; the next failure starts over).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Runs `op` until it succeeds, fails with an error `class` calls fatal, or `policy`'s
/// attempts are spent; `on_retry` sees each failure that is retried, its number and the
/// wait before the next attempt (for logs and metrics).
pub async fn retry<T, E, C, Fut>(
    policy: Policy,
    mut op: impl FnMut() -> Fut,
    class: impl Fn(&E) -> C,
    mut on_retry: impl FnMut(&E, u32, Duration),
) -> Result<T, E>
where
    C: Into<ErrorClass>,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempts = policy.start();
    loop {
        let e = match op().await {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        let Some(wait) = attempts.retry_after(class(&e)) else {
            return Err(e);
        };
        on_retry(&e, attempts.failures(), wait);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_with_jitter() {
        let policy = Policy::backoff(Duration::from_millis(100), Duration::from_secs(5));
        for failure in 1..30 {
            let d = policy.wait(failure);
            let full = (100u64 << (failure - 1).min(16)).min(5000);
            assert!(
                d.as_millis() as u64 >= full / 2 && d.as_millis() as u64 <= full,
                "{failure}: {d:?}"
            );
        }
        assert_eq!(Policy::immediate().wait(7), Duration::ZERO);
    }

    #[test]
    fn only_transient_failures_are_retried_and_only_as_often_as_allowed() {
        let policy = Policy::immediate().attempts(3);
        let mut attempts = policy.start();
        assert_eq!(attempts.retry_after(ErrorClass::Fatal), None);
        let mut attempts2 = policy.start();
        assert!(attempts2.retry_after(ErrorClass::Transient).is_some());
        assert!(attempts2.retry_after(ErrorClass::Transient).is_some());
        assert_eq!(attempts2.retry_after(ErrorClass::Transient), None);
        assert_eq!(attempts2.failures(), 3);
        attempts.reset();
        assert_eq!(attempts.failures(), 0);
    }

    #[tokio::test]
    async fn retry_stops_at_success_at_a_fatal_error_and_when_attempts_are_spent() {
        let policy = Policy::immediate().attempts(4);
        let transient = |_: &&str| ErrorClass::Transient;
        let mut calls = 0;
        let ok: Result<u32, &str> = retry(
            policy,
            || {
                calls += 1;
                let n = calls;
                async move { if n < 3 { Err("down") } else { Ok(n) } }
            },
            transient,
            |_, _, _| {},
        )
        .await;
        assert_eq!(ok, Ok(3));

        let mut calls = 0;
        let spent: Result<(), &str> = retry(
            policy,
            || {
                calls += 1;
                async { Err("down") }
            },
            transient,
            |_, _, _| {},
        )
        .await;
        assert_eq!((spent, calls), (Err("down"), 4));

        let mut calls = 0;
        let fatal: Result<(), &str> = retry(
            policy,
            || {
                calls += 1;
                async { Err("refused") }
            },
            |_: &&str| ErrorClass::Fatal,
            |_, _, _| {},
        )
        .await;
        assert_eq!((fatal, calls), (Err("refused"), 1));
    }
}
