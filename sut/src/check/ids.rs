//! The ID rules that need more than one observation at a time: `ids.monotonic` in real-time
//! order over concurrent answers, and the IDs lost to gaps (`ids.gap_bounded`). `ids.unique` is
//! [`super::AtMostOnce`] over (ID space, ID); `ids.monotonic` per generator is
//! [`super::Rising`].

/// One answer of a concurrent history: when it was asked and when it was answered (one clock
/// for the whole history, e.g. nanoseconds since the run began), and its IDs in answer order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer<'a, I> {
    /// When the request was sent.
    pub invoked: u64,
    /// When its answer arrived (`>= invoked`).
    pub completed: u64,
    /// The IDs it handed out, in the order of the answer.
    pub ids: &'a [I],
}

/// An answer out of real-time order; `answer` and `above` index the slice given to
/// [`realtime_regressions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regression<I> {
    /// The IDs of one answer do not rise.
    NotRising {
        /// The answer.
        answer: usize,
    },
    /// The answer's lowest ID is not above the highest ID of an answer that completed before it
    /// was asked.
    NotAbove {
        /// The answer.
        answer: usize,
        /// Its lowest ID.
        low: I,
        /// The answer it should have been above: the highest of those completed before.
        above: usize,
        /// That answer's highest ID.
        top: I,
    },
}

/// `ids.monotonic` in real-time order (a generator that promises rising IDs to concurrent
/// clients, judged as Jepsen judges a linearizable counter): every answer's IDs rise, and its
/// lowest is above the highest ID of every answer that completed before it was invoked. Answers
/// that overlap in time may come in either order. Returns every regression, in invocation order.
#[must_use]
pub fn realtime_regressions<I: Ord + Copy>(answers: &[Answer<'_, I>]) -> Vec<Regression<I>> {
    let mut by_invoke: Vec<usize> = (0..answers.len()).collect();
    by_invoke.sort_by_key(|&i| answers[i].invoked);
    let mut by_complete: Vec<usize> = (0..answers.len()).collect();
    by_complete.sort_by_key(|&i| answers[i].completed);
    let top = |i: usize| answers[i].ids.iter().copied().max();
    let mut done = by_complete.into_iter().peekable();
    // The answer with the highest ID among those completed before the current invocation.
    let mut highest: Option<(usize, I)> = None;
    let mut found = Vec::new();
    for answer in by_invoke {
        let op = &answers[answer];
        debug_assert!(op.completed >= op.invoked, "answered before it was asked");
        while let Some(d) = done.next_if(|&d| answers[d].completed < op.invoked) {
            if let Some(t) = top(d)
                && highest.is_none_or(|(_, h)| t > h)
            {
                highest = Some((d, t));
            }
        }
        if op.ids.windows(2).any(|w| w[1] <= w[0]) {
            found.push(Regression::NotRising { answer });
        }
        if let (Some(low), Some((above, top))) = (op.ids.iter().copied().min(), highest)
            && low <= top
        {
            found.push(Regression::NotAbove {
                answer,
                low,
                above,
                top,
            });
        }
    }
    found
}

/// The IDs between the lowest and the highest of `ids` that are not among them (repeats
/// counted once): what `ids.gap_bounded` holds to its documented bound.
#[must_use]
pub fn lost(ids: impl IntoIterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
        return 0;
    };
    let span = last - first + 1;
    debug_assert!(span >= ids.len() as u64);
    span - ids.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(invoked: u64, completed: u64, ids: &[i64]) -> Answer<'_, i64> {
        Answer {
            invoked,
            completed,
            ids,
        }
    }

    #[test]
    fn realtime_holds_for_rising_and_for_overlapping_answers() {
        let sequential = [
            answer(0, 1, &[1, 2]),
            answer(2, 3, &[3]),
            answer(4, 5, &[9]),
        ];
        assert!(realtime_regressions(&sequential).is_empty());
        // Overlapping in time: either order is allowed.
        let overlapping = [answer(0, 10, &[5]), answer(1, 9, &[4])];
        assert!(realtime_regressions(&overlapping).is_empty());
    }

    #[test]
    fn realtime_fires_on_an_answer_below_one_completed_before_it_was_asked() {
        let bad = [answer(0, 1, &[7]), answer(2, 3, &[9]), answer(4, 5, &[8])];
        assert_eq!(
            realtime_regressions(&bad),
            vec![Regression::NotAbove {
                answer: 2,
                low: 8,
                above: 1,
                top: 9
            }]
        );
        let equal = [answer(0, 1, &[7]), answer(2, 3, &[7])];
        assert_eq!(
            realtime_regressions(&equal).len(),
            1,
            "an equal ID is no rise"
        );
    }

    #[test]
    fn realtime_fires_on_an_answer_whose_ids_do_not_rise() {
        let batch = [answer(0, 1, &[3, 2])];
        assert_eq!(
            realtime_regressions(&batch),
            vec![Regression::NotRising { answer: 0 }]
        );
        let empty: [Answer<'_, i64>; 2] = [answer(0, 1, &[]), answer(2, 3, &[])];
        assert!(realtime_regressions(&empty).is_empty());
    }

    #[test]
    fn lost_counts_the_holes_once() {
        assert_eq!(lost([]), 0);
        assert_eq!(lost([5]), 0);
        assert_eq!(lost([1, 2, 3]), 0);
        assert_eq!(lost([1, 3, 3, 10]), 7);
    }
}
