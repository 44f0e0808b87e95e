# shellcheck shell=bash
# Before an upload: make the run's workdir (seeded from the newest workdir under root, by hard links),
# then list what it holds (path, size, mtime) so only what differs is sent. Parameters set above it by
# launcher/backends/ssh.py (shell-quoted): w (the workdir), root (the launch root on the host).
: "${w:?}" "${root:?}"
W=$w
if [ ! -d "$W" ]; then
  mkdir -p "$(dirname "$W")"
  # shellcheck disable=SC2012  # the newest by mtime; run roots are launch's own names (no newlines)
  prev=$(ls -dt "$root"/*/workdir 2>/dev/null | head -n1)
  # Hard links to the newest workdir: free, and safe because tar replaces a file by unlinking it.
  # shellcheck disable=SC2015  # a failed copy or move leaves no half seed either way
  if [ -n "$prev" ]; then cp -al "$prev" "$W.seed" 2>/dev/null && mv "$W.seed" "$W" || rm -rf "$W.seed"; fi
  mkdir -p "$W"
fi
cd "$W" && find . -name __pycache__ -prune -o -type f -printf '%P\t%s\t%T@\n'
