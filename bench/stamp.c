/* bench helper: print "stamp <CLOCK_REALTIME ns>" on stdout, then exec the rest of argv (if any).
 * Put in front of lark-job-wrapper it marks the instant the wrapper is exec'd; as the job's program it marks the
 * instant the job runs. C, so that the stamp costs microseconds, not an interpreter's start-up. */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    printf("stamp %lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    fflush(stdout);
    if (argc > 1) {
        execvp(argv[1], &argv[1]);
        perror("execvp");
        return 127;
    }
    return 0;
}
