// A minimal observable state: set() merges a patch and tells subscribers which keys changed.

export function createStore(initial) {
  let state = { ...initial };
  const subscribers = new Set();
  return {
    get: () => state,
    set(patch) {
      const changed = new Set(Object.keys(patch).filter((k) => !Object.is(state[k], patch[k])));
      if (!changed.size) return;
      state = { ...state, ...patch };
      for (const fn of [...subscribers]) fn(state, changed);
    },
    subscribe(fn) {
      subscribers.add(fn);
      return () => subscribers.delete(fn);
    },
  };
}
