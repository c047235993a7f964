//! The send window's packet handles, oldest first: a ring that grows by doubling. Not
//! `VecDeque`, whose `push_back` and `pop_front` stay out of line in the AM send and
//! acknowledgement paths (a call and a return per packet each way).

/// Handles of the packets in flight, oldest first.
pub struct Window<S> {
    ring: Vec<S>,
    head: usize,
    len: usize,
}

impl<S: Copy> Window<S> {
    /// An empty window that holds `cap` handles (at least one) before it grows; `fill` pads
    /// the unused places.
    pub fn with_capacity(cap: usize, fill: S) -> Window<S> {
        Window {
            ring: vec![fill; cap.max(1)],
            head: 0,
            len: 0,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Position in the ring of the `i`-th oldest (`i <= ring.len()`).
    #[inline]
    fn at(&self, i: usize) -> usize {
        let p = self.head + i;
        if p >= self.ring.len() {
            p - self.ring.len()
        } else {
            p
        }
    }

    #[inline]
    pub fn push_back(&mut self, s: S) {
        if self.len == self.ring.len() {
            self.grow();
        }
        let p = self.at(self.len);
        self.ring[p] = s;
        self.len += 1;
    }

    #[inline]
    pub fn pop_front(&mut self) -> Option<S> {
        if self.len == 0 {
            return None;
        }
        let s = self.ring[self.head];
        self.head = self.at(1);
        self.len -= 1;
        Some(s)
    }

    /// The `i`-th oldest.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&S> {
        (i < self.len).then(|| &self.ring[self.at(i)])
    }

    /// Doubles the ring, the handles in order from its start.
    #[cold]
    fn grow(&mut self) {
        let n = self.ring.len();
        let mut ring = Vec::with_capacity(n * 2);
        ring.extend((0..self.len).map(|i| self.ring[self.at(i)]));
        ring.resize(n * 2, self.ring[0]);
        self.ring = ring;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_across_wraps_and_growth() {
        let mut w = Window::with_capacity(2, 0u32);
        let (mut next_in, mut next_out) = (0u32, 0u32);
        // pushes and pops interleaved so that the head wraps, and the ring grows while wrapped
        for round in 0..50 {
            for _ in 0..(round % 5 + 1) {
                w.push_back(next_in);
                next_in += 1;
            }
            for _ in 0..(round % 3) {
                if let Some(s) = w.pop_front() {
                    assert_eq!(s, next_out);
                    next_out += 1;
                }
            }
            assert_eq!(w.len() as u32, next_in - next_out);
            for i in 0..w.len() {
                assert_eq!(w.get(i), Some(&(next_out + i as u32)));
            }
            assert_eq!(w.get(w.len()), None);
        }
        while let Some(s) = w.pop_front() {
            assert_eq!(s, next_out);
            next_out += 1;
        }
        assert!(w.is_empty());
        assert_eq!(next_out, next_in);
    }
}
