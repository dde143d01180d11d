//! A ration of costly work that unauthenticated requests can ask for (a token bucket): up to
//! `per_second` a second, and as a burst.

use std::sync::Mutex;
use std::time::Instant;

pub struct Ration {
    per_second: f64,
    /// (tokens, last refill).
    state: Mutex<(f64, Instant)>,
}

impl Ration {
    /// A full ration of `per_second`.
    pub fn new(per_second: f64) -> Ration {
        Ration {
            per_second,
            state: Mutex::new((per_second, Instant::now())),
        }
    }

    /// Takes one; `false` when the ration is spent for now.
    pub fn take(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, last) = *state;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.per_second)
            .min(self.per_second);
        if tokens < 1.0 {
            *state = (tokens, now);
            return false;
        }
        *state = (tokens - 1.0, now);
        true
    }

    #[cfg(test)]
    pub fn age(&self, by: std::time::Duration) {
        self.state.lock().unwrap().1 -= by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ration_is_spent_then_comes_back_with_time() {
        let ration = Ration::new(100.0);
        let burst = (0..1000).take_while(|_| ration.take()).count();
        assert_eq!(burst, 100);
        assert!(!ration.take());
        // A second later it is whole again.
        ration.age(std::time::Duration::from_secs(1));
        assert_eq!((0..1000).take_while(|_| ration.take()).count(), 100);
    }
}
