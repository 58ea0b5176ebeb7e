/* A small fake libnvidia-ml.so.1 for streamchaos tests, written from the NVML prototypes.
 *
 * It exports the (versioned) symbols nvidia-ml-py loads, follows the header's return codes
 * and keeps the mutable device state (locked clocks, power limit, ...) in a file named by
 * FAKE_NVML_STATE, so a lock set by a process that was killed is still visible to the
 * process that rolls it back. Without FAKE_NVML_STATE the state lives in this process only.
 *
 * Knobs (environment, read on every call):
 *   FAKE_NVML_STATE=path   state file (flock'd; read on each call, written by each setter)
 *   FAKE_NVML_DENY=1       every setter returns NVML_ERROR_NO_PERMISSION
 *   FAKE_NVML_ARCH=n       architecture (default 9 = Hopper; < 5 = pre-Volta: no locked SM clocks)
 *   FAKE_NVML_DEVICES=n    device count (default 1, at most 8)
 *   FAKE_NVML_LOST=1       every device call returns NVML_ERROR_GPU_IS_LOST
 *
 * State file format, one "devN.key=value" per line (tests read it directly):
 *   devN.locked_min / devN.locked_max   locked SM clock range in MHz, 0 = not locked
 *   devN.mem_locked_min / mem_locked_max
 *   devN.power_limit_mw
 *   devN.app_sm / devN.app_mem          application clocks, 0 = default
 *   devN.lock_calls / devN.reset_calls  how many times each setter succeeded
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define CLOCK_GRAPHICS 0
#define CLOCK_SM 1
#define CLOCK_MEM 2
#define CLOCK_VIDEO 3

#define CLOCK_ID_CURRENT 0
#define CLOCK_ID_APP_TARGET 1
#define CLOCK_ID_APP_DEFAULT 2
#define CLOCK_ID_BOOST_MAX 3

#define LIMIT_ID_TDP 0xffffff01u
#define LIMIT_ID_UNLIMITED 0xffffff02u

#define REASON_APP_CLOCKS 0x2ull /* this fake reports a clock lock with this bit */
#define REASON_SW_POWER_CAP 0x4ull
#define REASONS_SUPPORTED 0x1ffull

#define ARCH_VOLTA 5
#define ARCH_AMPERE 7
#define MAX_DEVICES 8

/* A device as the hardware would report it: fixed facts plus the mutable state. */
#define MAX_SM_MHZ 1980u
#define MIN_SM_MHZ 210u
#define SM_STEP_MHZ 15u
#define TDP_SM_MHZ 1755u
#define MEM_HIGH_MHZ 2619u
#define MEM_LOW_MHZ 1593u
#define POWER_MIN_MW 200000u
#define POWER_MAX_MW 700000u
#define POWER_DEFAULT_MW 700000u
#define POWER_DRAW_MW 450000u
#define MEM_TOTAL (80ull * 1024 * 1024 * 1024)
#define MEM_USED (1ull * 1024 * 1024 * 1024)

typedef struct {
    unsigned int locked_min, locked_max;
    unsigned int mem_locked_min, mem_locked_max;
    unsigned int power_limit_mw;
    unsigned int app_sm, app_mem;
    unsigned int lock_calls, reset_calls;
} dev_state;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

/* Opaque handles: the address of one byte per device; the index is the offset. */
static char g_handles[MAX_DEVICES];
static int g_init_count = 0;
static dev_state g_mem_state[MAX_DEVICES];
static int g_mem_state_ready = 0;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return (v && *v) ? atoi(v) : fallback;
}

static int device_count(void) {
    int n = env_int("FAKE_NVML_DEVICES", 1);
    if (n < 0) n = 0;
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    return n;
}

static void default_state(dev_state *s) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        memset(&s[i], 0, sizeof(dev_state));
        s[i].power_limit_mw = POWER_DEFAULT_MW;
    }
}

static void parse_state(FILE *f, dev_state *s) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
        int dev;
        char key[64];
        unsigned int value;
        if (sscanf(line, "dev%d.%63[^=]=%u", &dev, key, &value) != 3) continue;
        if (dev < 0 || dev >= MAX_DEVICES) continue;
        dev_state *d = &s[dev];
        if (!strcmp(key, "locked_min")) d->locked_min = value;
        else if (!strcmp(key, "locked_max")) d->locked_max = value;
        else if (!strcmp(key, "mem_locked_min")) d->mem_locked_min = value;
        else if (!strcmp(key, "mem_locked_max")) d->mem_locked_max = value;
        else if (!strcmp(key, "power_limit_mw")) d->power_limit_mw = value;
        else if (!strcmp(key, "app_sm")) d->app_sm = value;
        else if (!strcmp(key, "app_mem")) d->app_mem = value;
        else if (!strcmp(key, "lock_calls")) d->lock_calls = value;
        else if (!strcmp(key, "reset_calls")) d->reset_calls = value;
    }
}

static void write_state(FILE *f, const dev_state *s) {
    for (int i = 0; i < MAX_DEVICES; i++) {
        const dev_state *d = &s[i];
        fprintf(f, "dev%d.locked_min=%u\ndev%d.locked_max=%u\n", i, d->locked_min, i, d->locked_max);
        fprintf(f, "dev%d.mem_locked_min=%u\ndev%d.mem_locked_max=%u\n", i, d->mem_locked_min, i,
                d->mem_locked_max);
        fprintf(f, "dev%d.power_limit_mw=%u\n", i, d->power_limit_mw);
        fprintf(f, "dev%d.app_sm=%u\ndev%d.app_mem=%u\n", i, d->app_sm, i, d->app_mem);
        fprintf(f, "dev%d.lock_calls=%u\ndev%d.reset_calls=%u\n", i, d->lock_calls, i, d->reset_calls);
    }
}

/* Open the state file and take the lock; the caller reads s and may write it back.
 * Returns the fd (>= 0), -1 when there is no state file (in-process state), -2 on error. */
static int state_begin(dev_state *s, int exclusive) {
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path || !*path) {
        if (!g_mem_state_ready) {
            default_state(g_mem_state);
            g_mem_state_ready = 1;
        }
        memcpy(s, g_mem_state, sizeof g_mem_state);
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) return -2;
    if (flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0) {
        close(fd);
        return -2;
    }
    default_state(s);
    int dup_fd = dup(fd);
    FILE *f = dup_fd >= 0 ? fdopen(dup_fd, "r") : NULL;
    if (f) {
        parse_state(f, s);
        fclose(f);
    }
    return fd;
}

static int state_commit(int fd, const dev_state *s) {
    if (fd == -1) {
        memcpy(g_mem_state, s, sizeof g_mem_state);
        return 0;
    }
    char buf[8192];
    FILE *mf = fmemopen(buf, sizeof buf, "w");
    if (!mf) return -1;
    write_state(mf, s);
    long n = ftell(mf);
    fclose(mf);
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) return -1;
    if (write(fd, buf, (size_t)n) != n) return -1;
    fsync(fd);
    return 0;
}

static void state_end(int fd) {
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

static int read_state(dev_state *s) {
    int fd = state_begin(s, 0);
    if (fd == -2) return -1;
    state_end(fd);
    return 0;
}

/* Validate init and a handle; on success *index is the device's index. */
static nvmlReturn_t check_device(nvmlDevice_t device, int *index) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    char *p = (char *)device;
    if (p < g_handles || p >= g_handles + device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    if (env_int("FAKE_NVML_LOST", 0)) return NVML_ERROR_GPU_IS_LOST;
    *index = (int)(p - g_handles);
    return NVML_SUCCESS;
}

static unsigned int arch(void) { return (unsigned int)env_int("FAKE_NVML_ARCH", 9); }
static int denied(void) { return env_int("FAKE_NVML_DENY", 0) != 0; }

/* The SM clock "under load": max, capped by a lock, app clocks and the power limit. */
static unsigned int current_sm(const dev_state *d) {
    unsigned int clock = MAX_SM_MHZ;
    if (d->locked_max && d->locked_max < clock) clock = d->locked_max;
    if (d->app_sm && d->app_sm < clock) clock = d->app_sm;
    if (d->power_limit_mw < POWER_DRAW_MW) {
        unsigned int capped = (unsigned int)((unsigned long long)MAX_SM_MHZ * d->power_limit_mw / POWER_DRAW_MW);
        if (capped < clock) clock = capped;
    }
    return clock;
}

static unsigned long long current_reasons(const dev_state *d) {
    unsigned long long r = 0;
    if (d->locked_max || d->app_sm) r |= REASON_APP_CLOCKS;
    if (d->power_limit_mw < POWER_DRAW_MW) r |= REASON_SW_POWER_CAP;
    return r;
}

static int supported_sm_clock(unsigned int mhz) {
    return mhz >= MIN_SM_MHZ && mhz <= MAX_SM_MHZ && (MAX_SM_MHZ - mhz) % SM_STEP_MHZ == 0;
}

/* ---- init / system ---------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    g_init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    g_init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    return copy_string("999.99.fake", version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    return copy_string("13.999.fake", version, length);
}

/* ---- devices ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned int)device_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (g_init_count <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)device_count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(g_handles + index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    char text[64];
    snprintf(text, sizeof text, "Fake NVML GPU %d", i);
    return copy_string(text, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    char text[64];
    snprintf(text, sizeof text, "GPU-fa4e0000-0000-4000-8000-00000000000%d", i);
    return copy_string(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *out) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = arch();
    return NVML_SUCCESS;
}

/* ---- clocks: read ----------------------------------------------------------------------- */

static nvmlReturn_t clock_of(int i, int type, int id, unsigned int *clock) {
    dev_state s[MAX_DEVICES];
    if (read_state(s)) return NVML_ERROR_UNKNOWN;
    const dev_state *d = &s[i];
    if (type == CLOCK_SM || type == CLOCK_GRAPHICS) {
        if (id == CLOCK_ID_CURRENT) *clock = current_sm(d);
        else if (id == CLOCK_ID_APP_TARGET) *clock = d->app_sm ? d->app_sm : TDP_SM_MHZ;
        else if (id == CLOCK_ID_APP_DEFAULT) *clock = TDP_SM_MHZ;
        else if (id == CLOCK_ID_BOOST_MAX) *clock = MAX_SM_MHZ;
        else return NVML_ERROR_INVALID_ARGUMENT;
    } else if (type == CLOCK_MEM) {
        if (id == CLOCK_ID_CURRENT) *clock = d->mem_locked_max ? d->mem_locked_max : MEM_HIGH_MHZ;
        else if (id == CLOCK_ID_APP_TARGET) *clock = d->app_mem ? d->app_mem : MEM_HIGH_MHZ;
        else if (id == CLOCK_ID_APP_DEFAULT || id == CLOCK_ID_BOOST_MAX) *clock = MEM_HIGH_MHZ;
        else return NVML_ERROR_INVALID_ARGUMENT;
    } else if (type == CLOCK_VIDEO) {
        *clock = 1755;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!clock) return NVML_ERROR_INVALID_ARGUMENT;
    return clock_of(i, type, CLOCK_ID_CURRENT, clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!clock) return NVML_ERROR_INVALID_ARGUMENT;
    if (type == CLOCK_SM || type == CLOCK_GRAPHICS) *clock = MAX_SM_MHZ;
    else if (type == CLOCK_MEM) *clock = MEM_HIGH_MHZ;
    else if (type == CLOCK_VIDEO) *clock = 1755;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, int clockType, int clockId, unsigned int *clockMHz) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!clockMHz) return NVML_ERROR_INVALID_ARGUMENT;
    return clock_of(i, clockType, clockId, clockMHz);
}

/* The two-call protocol: a probe with clocks == NULL (or too small a count) gets
 * INSUFFICIENT_SIZE and the needed count; the second call fills the array. */
static nvmlReturn_t fill_list(const unsigned int *values, unsigned int n, unsigned int *count, unsigned int *out) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!out || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(out, values, n * sizeof(unsigned int));
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count, unsigned int *clocksMHz) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    static const unsigned int mem[] = {MEM_HIGH_MHZ, MEM_LOW_MHZ};
    return fill_list(mem, 2, count, clocksMHz);
}

nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memoryClockMHz,
                                                  unsigned int *count, unsigned int *clocksMHz) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    unsigned int values[256];
    unsigned int n = 0;
    /* The lower memory clock only offers the lower half of the SM clocks, as real boards do. */
    unsigned int top;
    if (memoryClockMHz == MEM_HIGH_MHZ) top = MAX_SM_MHZ;
    else if (memoryClockMHz == MEM_LOW_MHZ) top = 1095;
    else return NVML_ERROR_NOT_FOUND;
    for (unsigned int mhz = MAX_SM_MHZ; mhz >= MIN_SM_MHZ && n < 256; mhz -= SM_STEP_MHZ)
        if (mhz <= top) values[n++] = mhz;
    return fill_list(values, n, count, clocksMHz);
}

/* ---- clocks: write ---------------------------------------------------------------------- */

/* One setter transaction: lock the state file, apply, write back. */
typedef nvmlReturn_t (*apply_fn)(dev_state *d, unsigned int a, unsigned int b);

static nvmlReturn_t setter(nvmlDevice_t device, apply_fn apply, unsigned int a, unsigned int b) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (denied()) return NVML_ERROR_NO_PERMISSION;
    dev_state s[MAX_DEVICES];
    int fd = state_begin(s, 1);
    if (fd == -2) return NVML_ERROR_UNKNOWN;
    rc = apply(&s[i], a, b);
    if (rc == NVML_SUCCESS && state_commit(fd, s) != 0) rc = NVML_ERROR_UNKNOWN;
    state_end(fd);
    return rc;
}

static nvmlReturn_t apply_lock(dev_state *d, unsigned int lo, unsigned int hi) {
    if (arch() < ARCH_VOLTA) return NVML_ERROR_NOT_SUPPORTED;
    int lo_sym = lo == LIMIT_ID_TDP || lo == LIMIT_ID_UNLIMITED;
    int hi_sym = hi == LIMIT_ID_TDP || hi == LIMIT_ID_UNLIMITED;
    if (lo_sym != hi_sym) return NVML_ERROR_INVALID_ARGUMENT; /* symbols must not mix with numbers */
    if (lo_sym) {
        if (lo != hi) return NVML_ERROR_INVALID_ARGUMENT;
        if (lo == LIMIT_ID_UNLIMITED) {
            d->locked_min = d->locked_max = 0;
            d->reset_calls++;
        } else {
            d->locked_min = d->locked_max = TDP_SM_MHZ;
            d->lock_calls++;
        }
        return NVML_SUCCESS;
    }
    if (lo > hi || hi > MAX_SM_MHZ || lo < MIN_SM_MHZ) return NVML_ERROR_INVALID_ARGUMENT;
    d->locked_min = lo;
    d->locked_max = hi;
    d->lock_calls++;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_reset(dev_state *d, unsigned int a, unsigned int b) {
    (void)a;
    (void)b;
    if (arch() < ARCH_VOLTA) return NVML_ERROR_NOT_SUPPORTED;
    d->locked_min = d->locked_max = 0;
    d->reset_calls++;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_mem_lock(dev_state *d, unsigned int lo, unsigned int hi) {
    if (arch() < ARCH_AMPERE) return NVML_ERROR_NOT_SUPPORTED;
    if (lo > hi || hi > MEM_HIGH_MHZ) return NVML_ERROR_INVALID_ARGUMENT;
    d->mem_locked_min = lo;
    d->mem_locked_max = hi;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_mem_reset(dev_state *d, unsigned int a, unsigned int b) {
    (void)a;
    (void)b;
    if (arch() < ARCH_AMPERE) return NVML_ERROR_NOT_SUPPORTED;
    d->mem_locked_min = d->mem_locked_max = 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_app_clocks(dev_state *d, unsigned int mem, unsigned int sm) {
    if ((mem != MEM_HIGH_MHZ && mem != MEM_LOW_MHZ) || !supported_sm_clock(sm)) return NVML_ERROR_INVALID_ARGUMENT;
    d->app_mem = mem;
    d->app_sm = sm;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_app_reset(dev_state *d, unsigned int a, unsigned int b) {
    (void)a;
    (void)b;
    d->app_mem = d->app_sm = 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t apply_power(dev_state *d, unsigned int mw, unsigned int b) {
    (void)b;
    if (mw < POWER_MIN_MW || mw > POWER_MAX_MW) return NVML_ERROR_INVALID_ARGUMENT;
    d->power_limit_mw = mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int minGpuClockMHz, unsigned int maxGpuClockMHz) {
    return setter(device, apply_lock, minGpuClockMHz, maxGpuClockMHz);
}

nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device) { return setter(device, apply_reset, 0, 0); }

nvmlReturn_t nvmlDeviceSetMemoryLockedClocks(nvmlDevice_t device, unsigned int minMemClockMHz, unsigned int maxMemClockMHz) {
    return setter(device, apply_mem_lock, minMemClockMHz, maxMemClockMHz);
}

nvmlReturn_t nvmlDeviceResetMemoryLockedClocks(nvmlDevice_t device) { return setter(device, apply_mem_reset, 0, 0); }

nvmlReturn_t nvmlDeviceSetApplicationsClocks(nvmlDevice_t device, unsigned int memClockMHz, unsigned int graphicsClockMHz) {
    return setter(device, apply_app_clocks, memClockMHz, graphicsClockMHz);
}

nvmlReturn_t nvmlDeviceResetApplicationsClocks(nvmlDevice_t device) { return setter(device, apply_app_reset, 0, 0); }

nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit) {
    return setter(device, apply_power, limit, 0);
}

/* ---- clock-event reasons ---------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    dev_state s[MAX_DEVICES];
    if (read_state(s)) return NVML_ERROR_UNKNOWN;
    *reasons = current_reasons(&s[i]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *supported) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!supported) return NVML_ERROR_INVALID_ARGUMENT;
    *supported = REASONS_SUPPORTED;
    return NVML_SUCCESS;
}

/* ---- memory ----------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = MEM_TOTAL;
    memory->used = MEM_USED;
    memory->free = MEM_TOTAL - MEM_USED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = MEM_TOTAL;
    memory->reserved = 0;
    memory->used = MEM_USED;
    memory->free = MEM_TOTAL - MEM_USED;
    return NVML_SUCCESS;
}

/* ---- power (milliwatts) ----------------------------------------------------------------- */

static nvmlReturn_t power_get(nvmlDevice_t device, unsigned int *out, int which) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    dev_state s[MAX_DEVICES];
    if (read_state(s)) return NVML_ERROR_UNKNOWN;
    const dev_state *d = &s[i];
    if (which == 0) *out = d->power_limit_mw;
    else if (which == 1) *out = POWER_DEFAULT_MW;
    else *out = d->power_limit_mw < POWER_DRAW_MW ? d->power_limit_mw - 5000 : POWER_DRAW_MW;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) { return power_get(device, limit, 0); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) { return power_get(device, limit, 0); }
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit) { return power_get(device, limit, 1); }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) { return power_get(device, power, 2); }

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit, unsigned int *maxLimit) {
    int i;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc) return rc;
    if (!minLimit || !maxLimit) return NVML_ERROR_INVALID_ARGUMENT;
    *minLimit = POWER_MIN_MW;
    *maxLimit = POWER_MAX_MW;
    return NVML_SUCCESS;
}
