# shellcheck shell=bash
# The host as the ssh backend sees it before a run (launcher/backends/ssh.py `probe`), one name=value a
# line: home, its GPUs by nvidia-smi, else by their device files (nvidia-smi is off a non-login shell's
# PATH on some hosts), `busy` the processes computing on them now (another run's trainer), the python.
echo "home=$HOME"
n=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
[ "$n" -gt 0 ] || n=$(find /dev -maxdepth 1 -name 'nvidia[0-9]*' 2>/dev/null | wc -l)
echo "gpus=$n"
echo "busy=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c "[0-9]")"
echo "python=$(command -v python3 python 2>/dev/null | head -n1)"
