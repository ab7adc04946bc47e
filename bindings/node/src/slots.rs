//! A slab: values under small reusable `u32` ids (task ids, request ids,
//! stream ids) that the wrapper can hold as plain numbers.

pub struct Slots<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slots<T> {
    /// Stores the value `make` builds from its id.
    pub fn insert_with(&mut self, make: impl FnOnce(u32) -> T) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = Some(make(id));
                id
            }
            None => {
                let id = u32::try_from(self.items.len()).expect("fewer than 2^32 live slots");
                self.items.push(Some(make(id)));
                id
            }
        }
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.items.get_mut(id as usize).and_then(Option::as_mut)
    }

    pub fn get(&self, id: u32) -> Option<&T> {
        self.items.get(id as usize).and_then(Option::as_ref)
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        let taken = self.items.get_mut(id as usize).and_then(Option::take);
        if taken.is_some() {
            self.free.push(id);
        }
        taken
    }

    pub fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }

    /// Removes every value.
    pub fn clear(&mut self) {
        self.items.clear();
        self.free.clear();
    }
}
