#!/bin/bash
# build.sh OLDINC NEWINC
set -e
cd "$(dirname "$0")"
g++ -O3 -DNDEBUG -fopenmp -std=gnu++20 -Ddiloco=dl_old -DNAME=run_old -I$1 -c ab_pass.cpp -o /tmp/ab_old.o &
g++ -O3 -DNDEBUG -fopenmp -std=gnu++20 -Ddiloco=dl_new -DNAME=run_new -I$2 -c ab_pass.cpp -o /tmp/ab_new.o &
wait
g++ -O3 -fopenmp ab_main.cpp /tmp/ab_old.o /tmp/ab_new.o -o /tmp/ab
