//! Endpoint ids: a slot index (16 bits) plus a generation (8 bits), so an id that is reused
//! after its endpoint is gone does not match late packets addressed to the old endpoint.

/// Largest number of endpoints per interface.
pub const MAX_EPS: usize = 0xFFFF;

struct Slot<T> {
    gen: u8,
    val: Option<T>,
}

/// A table of values by 24-bit id (never `0xFFFFFF`, the wire's "no endpoint").
pub struct EpTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u16>,
    len: usize,
}

impl<T> Default for EpTable<T> {
    fn default() -> Self {
        EpTable {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> EpTable<T> {
    /// Inserts `val`; `None` when the table is full.
    pub fn insert(&mut self, val: T) -> Option<u32> {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None if self.slots.len() < MAX_EPS => {
                self.slots.push(Slot { gen: 0, val: None });
                self.slots.len() - 1
            }
            None => return None,
        };
        let s = &mut self.slots[idx];
        s.val = Some(val);
        self.len += 1;
        Some((s.gen as u32) << 16 | idx as u32)
    }

    fn slot(id: u32) -> (usize, u8) {
        ((id & 0xFFFF) as usize, (id >> 16) as u8)
    }

    /// The value of `id`, if it is still there.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&T> {
        let (idx, gen) = Self::slot(id);
        let s = self.slots.get(idx)?;
        if s.gen != gen || id >> 24 != 0 {
            return None;
        }
        s.val.as_ref()
    }

    /// Removes `id`; its slot gets a new generation.
    pub fn remove(&mut self, id: u32) -> Option<T> {
        self.get(id)?;
        let (idx, _) = Self::slot(id);
        let s = &mut self.slots[idx];
        s.gen = s.gen.wrapping_add(1);
        self.free.push(idx as u16);
        self.len -= 1;
        s.val.take()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.val.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_a_generation() {
        let mut t = EpTable::default();
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(t.get(a), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        let c = t.insert("c").unwrap();
        assert_eq!(c, 1 << 16, "same slot, next generation");
        assert_eq!(t.get(a), None, "a stale id does not reach the new endpoint");
        assert_eq!(t.get(c), Some(&"c"));
        assert_eq!(t.get(c | 1 << 24), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.values().count(), 2);
    }

    #[test]
    fn ids_never_collide_with_the_wire_none() {
        let mut t = EpTable::default();
        for _ in 0..300 {
            let id = t.insert(()).unwrap();
            assert!(id < super::super::wire::EP_ID_NONE);
            t.remove(id);
        }
        let mut full = EpTable::default();
        for _ in 0..MAX_EPS {
            assert!(full.insert(()).unwrap() < super::super::wire::EP_ID_NONE);
        }
        assert_eq!(full.insert(()), None);
    }
}
