#!/bin/sh
# The `ask-first` example's agent: it cannot act until a person answers one question.
#
# Tether's command-brain protocol: the instruction arrives on stdin. To ask a person, the
# agent prints "TETHER_ESCALATE: <question>" on stderr and exits non-zero; the run waits
# (status `waiting`), and the answer comes back in the next instruction, under
# "A person sent these messages", as a line "- <answer>".
instruction=$(cat)
answer=$(printf '%s\n' "$instruction" | sed -n '/^A person sent these messages/,$ s/^- //p' | tail -n 1)
if [ -z "$answer" ]; then
    echo "TETHER_ESCALATE: What should greeting.txt say?" >&2
    exit 3
fi
printf '%s\n' "$answer" > greeting.txt
echo "wrote greeting.txt: $answer"
