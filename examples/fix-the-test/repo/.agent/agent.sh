#!/bin/sh
# A scripted "agent": attempt 1 makes a wrong fix, attempt 2 the right one.
set -eu
echo "task: $BERTH_TASK (attempt $BERTH_ATTEMPT)"
echo "instructions: $BERTH_INSTRUCTIONS"
if [ "$BERTH_ATTEMPT" = 1 ]; then
  sed -i 's/return a - b/return a * b/' calc.py
  echo "changed - to * (wrong)"
else
  sed -i -e 's/return a - b/return a + b/' -e 's/return a \* b/return a + b/' calc.py
  echo "changed to + (right)"
fi
