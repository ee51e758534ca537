export function mount(root) { root.textContent = "playground"; }
