//! Finished requests' allocations, kept by their worker for the next request of the same type
//! (UCX's request mpool): a small receive or a queued send then allocates nothing.
//!
//! A request goes back when the application drops its [`super::Request`] after the operation
//! finished (the operation's side holds no reference then); it is reset there and handed out
//! again by the next [`super::request`] of its type. A few types are in use at once, so the
//! pool is a short list scanned by `TypeId`; each type keeps at most [`PER_TYPE`] requests,
//! and at most [`TYPES`] types are kept.

use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Requests kept per type: a window of operations in flight (a burst beyond it allocates;
/// what the pool keeps stays small next to an endpoint's own memory).
const PER_TYPE: usize = 64;
/// Types kept.
const TYPES: usize = 8;

/// Kept requests of one type.
type Kept = Vec<Rc<dyn Any>>;

/// The pool (a field of the worker).
#[derive(Default)]
pub(crate) struct RequestPool {
    /// The request put back last: one operation in flight at a time (a ping-pong) takes it
    /// again without a search.
    hot: Cell<Option<Rc<dyn Any>>>,
    free: RefCell<Vec<(TypeId, Kept)>>,
}

impl RequestPool {
    /// A kept `S`, if there is one.
    #[inline(always)]
    pub fn take<S: 'static>(&self) -> Option<Rc<S>> {
        if let Some(h) = self.hot.take() {
            match h.downcast::<S>() {
                Ok(s) => return Some(s),
                Err(h) => self.keep(h),
            }
        }
        let id = TypeId::of::<S>();
        let mut free = self.free.try_borrow_mut().ok()?;
        let (_, list) = free.iter_mut().find(|(t, _)| *t == id)?;
        list.pop()?.downcast::<S>().ok()
    }

    /// Keeps `s` (already reset) for the next request of its type, or frees it when that
    /// type's list is full.
    #[inline(always)]
    pub fn put<S: 'static>(&self, s: Rc<S>) {
        if let Some(h) = self.hot.replace(Some(s)) {
            self.keep(h);
        }
    }

    #[inline(never)]
    fn keep(&self, s: Rc<dyn Any>) {
        let id = (*s).type_id();
        let Ok(mut free) = self.free.try_borrow_mut() else {
            return;
        };
        if let Some((_, list)) = free.iter_mut().find(|(t, _)| *t == id) {
            if list.len() < PER_TYPE {
                list.push(s);
            }
        } else if free.len() < TYPES {
            free.push((id, vec![s]));
        }
    }

    /// Requests kept, over all types.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let hot = self.hot.take();
        let n = usize::from(hot.is_some());
        self.hot.set(hot);
        n + self.free.borrow().iter().map(|(_, l)| l.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_by_type_and_bounded() {
        let p = RequestPool::default();
        assert!(p.take::<u32>().is_none());
        let a = Rc::new(7u32);
        let addr = Rc::as_ptr(&a);
        p.put(a);
        assert!(
            p.take::<u64>().is_none(),
            "another type's request is not handed out"
        );
        let b = p.take::<u32>().expect("kept");
        assert_eq!(Rc::as_ptr(&b), addr, "the same allocation comes back");
        assert!(p.take::<u32>().is_none());
        for _ in 0..PER_TYPE + 10 {
            p.put(Rc::new(1u32));
        }
        assert_eq!(p.len(), PER_TYPE + 1, "a full list, and the last one put");
        for i in 0..TYPES + 3 {
            match i {
                0 => p.put(Rc::new(1u8)),
                1 => p.put(Rc::new(1u16)),
                2 => p.put(Rc::new(1i8)),
                3 => p.put(Rc::new(1i16)),
                4 => p.put(Rc::new(1i32)),
                5 => p.put(Rc::new(1i64)),
                6 => p.put(Rc::new(1u64)),
                7 => p.put(Rc::new(1u128)),
                8 => p.put(Rc::new(1i128)),
                _ => p.put(Rc::new(1usize)),
            }
        }
        assert_eq!(p.free.borrow().len(), TYPES);
    }
}
