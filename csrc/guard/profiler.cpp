// profiler.cpp: torch.profiler sees the tpu. A libkineto::IActivityProfiler
// registered with torch's PrivateUse1ProfilerRegistry (torch 2.13's way for a
// PrivateUse1 backend to feed its profiler, through Kineto's child profilers):
// Kineto makes a session of it for each profile, starts and stops it with the
// profile and asks it for its activities at the end, which join torch's own
// in the trace (prof.export_chrome_trace) and in prof.key_averages().
//
// The session turns the engine's record on and off (csrc/engine/prof.h, read
// through _C's prof_api capsule) and, at the end, makes activities of it:
//   host (category privateuse1_runtime, on the thread that did it; kept when
//   the profile has CPU activities): "tpu::compile <what>", "tpu::load <what>"
//   (from the disk cache), "tpu::launch <what>", "tpu::upload",
//   "tpu::download" (bytes), "tpu::wait" (a sync point waiting for programs);
//   device (kept when it has ProfilerActivity.PrivateUse1, torch's default):
//   the programs, named "<what>", category kernel, from launch (or the
//   previous program's completion) to completion, and the copies "Memcpy HtoD
//   (tpu)" / "Memcpy DtoH (tpu)" (category gpu_memcpy), on one row per device
//   named "tpu:<i>". <what> is "aten::add.Tensor" (one op: strict and debug
//   modes) or "fused program of N ops". A launch and its program share a
//   correlation id and a flow arrow; both link to the torch op that ran them.
//
// Times are those of the engine's record: CLOCK_REALTIME ns, torch's clock.
// No C++ exception leaves this file: Kineto's callbacks catch everything.
// Built only where torch has Kineto (USE_KINETO, set by setup.py when the
// installed torch ships its headers); register_profiler is then available.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../python/prof_api.h"

#if defined(USE_KINETO) && __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>)
#define TPU_HAVE_KINETO 1
// GenericTraceActivity::addMetadata formats with fmt, which torch's libraries
// do not export: this file carries its own (header-only, hidden).
#define FMT_HEADER_ONLY
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

using libkineto::ActivityType;

const tpu_prof_api* api = nullptr; // set once, before the factory is registered

// The device rows' process ids: past any real pid and past the ids Kineto
// names "GPU 0".."GPU 15" in every trace with device activities.
constexpr int64_t kDevicePid = libkineto::kExceedMaxPid + 1000;

// The calling thread's torch ops (Kineto pushes and pops their correlation ids).
thread_local std::vector<uint64_t> correlations;

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(unsigned what) : what_(what) {}

  void start() override {
    api->start(what_);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    api->stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return errors_; }
  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start,
                    int64_t end) override {
    try {
      emit(logger, linked, start, end);
    } catch (...) {
      errors_.push_back("torchtpu: the tpu's activities could not be added to the trace");
    }
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return nullptr; // one per device, given to the logger by processTrace
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }
  void pushCorrelationId(uint64_t id) override {
    try {
      correlations.push_back(id);
      api->set_correlation(id);
    } catch (...) {
      api->set_correlation(0);
    }
  }
  void popCorrelationId() override {
    if (!correlations.empty()) correlations.pop_back();
    api->set_correlation(correlations.empty() ? 0 : correlations.back());
  }
  std::unordered_map<std::string, std::string> getMetadata() override { return metadata_; }

 private:
  libkineto::GenericTraceActivity& add(ActivityType type, const std::string& name, const tpu_prof_record& r,
                                       const libkineto::getLinkedActivityCallback& linked) {
    buffer_->emplace_activity(buffer_->span, type, name);
    auto& a = libkineto::CpuTraceBuffer::toRef(buffer_->activities.back());
    a.startTime = r.t0;
    a.endTime = r.t1;
    a.id = static_cast<int32_t>(r.flow);
    if (linked && r.corr) a.linked = linked(static_cast<int32_t>(r.corr));
    return a;
  }

  void host(libkineto::ActivityLogger& logger, const std::string& name, const tpu_prof_record& r,
            const libkineto::getLinkedActivityCallback& linked) {
    auto& a = add(ActivityType::PRIVATEUSE1_RUNTIME, name, r, linked);
    a.device = libkineto::processId();
    a.resource = r.tid;
    a.threadId = r.tid;
    a.addMetadata("device", r.dev);
    if (r.bytes) a.addMetadata("bytes", r.bytes);
    if (r.kind == TPU_PROF_LAUNCH && r.flow) {
      a.addMetadata("correlation", r.flow);
      a.flow.id = r.flow;
      a.flow.type = libkineto::kLinkAsyncCpuGpu;
      a.flow.start = 1;
    }
    logger.handleActivity(a);
  }

  void device(libkineto::ActivityLogger& logger, ActivityType type, const std::string& name, const tpu_prof_record& r,
              const libkineto::getLinkedActivityCallback& linked) {
    auto& a = add(type, name, r, linked);
    a.device = static_cast<int32_t>(kDevicePid + r.dev);
    a.resource = 0;
    a.addMetadata("device", r.dev);
    a.addMetadata("stream", 0);
    if (r.bytes) a.addMetadata("bytes", r.bytes);
    if (r.flow) {
      a.addMetadata("correlation", r.flow);
      a.flow.id = r.flow;
      a.flow.type = libkineto::kLinkAsyncCpuGpu;
      a.flow.start = 0;
    }
    devices_.insert(r.dev);
    logger.handleActivity(a);
  }

  void emit(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback& linked, int64_t start,
            int64_t end) {
    uint64_t dropped = 0;
    std::vector<tpu_prof_record> recs(api->snapshot(nullptr, 0, &dropped));
    recs.resize(std::min(recs.size(), api->snapshot(recs.data(), recs.size(), &dropped)));
    buffer_->span = libkineto::TraceSpan(start, end, "tpu");
    const bool hosts = what_ & TPU_PROF_HOST, devices = what_ & TPU_PROF_DEVICE;
    size_t unfinished = 0;
    for (const tpu_prof_record& r : recs) {
      if (r.kind == TPU_PROF_EXECUTE && r.t1 < 0) {
        unfinished++;
        continue;
      }
      if (end > start && (r.t1 < start || r.t0 > end))
        continue; // outside the profile's window (a schedule's active steps)
      std::string what(r.name);
      switch (r.kind) {
        case TPU_PROF_COMPILE: host(logger, "tpu::compile " + what, r, linked); break;
        case TPU_PROF_LOAD: host(logger, "tpu::load " + what, r, linked); break;
        case TPU_PROF_LAUNCH: host(logger, "tpu::launch " + what, r, linked); break;
        case TPU_PROF_WAIT: host(logger, "tpu::wait", r, linked); break;
        case TPU_PROF_EXECUTE: device(logger, ActivityType::CONCURRENT_KERNEL, what, r, linked); break;
        case TPU_PROF_UPLOAD:
        case TPU_PROF_DOWNLOAD: {
          bool up = r.kind == TPU_PROF_UPLOAD;
          if (hosts) host(logger, up ? "tpu::upload" : "tpu::download", r, linked);
          if (devices)
            device(logger, ActivityType::GPU_MEMCPY, up ? "Memcpy HtoD (tpu)" : "Memcpy DtoH (tpu)", r, linked);
          break;
        }
        default: break;
      }
    }
    for (int dev : devices_) {
      int64_t pid = kDevicePid + dev;
      std::string row = "tpu:" + std::to_string(dev);
      logger.handleDeviceInfo(libkineto::DeviceInfo{pid, pid, row, "tpu"}, start);
      logger.handleResourceInfo(libkineto::ResourceInfo{0, 0, pid, row}, start);
    }
    if (dropped) metadata_["tpu_dropped_records"] = std::to_string(dropped);
    if (unfinished) metadata_["tpu_unfinished_programs"] = std::to_string(unfinished);
  }

  unsigned what_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
  std::set<int> devices_;
  std::vector<std::string> errors_;
  std::unordered_map<std::string, std::string> metadata_;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config& /*config*/) override {
    try {
      unsigned what = 0;
      if (types.count(ActivityType::PRIVATEUSE1_RUNTIME)) what |= TPU_PROF_HOST; // CPU activities
      if (types.count(ActivityType::CONCURRENT_KERNEL) || types.count(ActivityType::GPU_MEMCPY))
        what |= TPU_PROF_DEVICE; // ProfilerActivity.PrivateUse1
      return std::make_unique<Session>(what);
    } catch (...) {
      return nullptr;
    }
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"torchtpu"};
  std::set<ActivityType> activities_{ActivityType::PRIVATEUSE1_RUNTIME, ActivityType::CONCURRENT_KERNEL,
                                     ActivityType::GPU_MEMCPY};
};

} // namespace
#endif

// register_profiler(torchtpu._C.prof_api) -> True when torch's profiler now
// asks the tpu for its activities, False where this torch has no Kineto.
// Registered with torch's registry, then handed to Kineto at once (the
// registry's onKinetoInit, which torch itself calls only for profiles that
// name ProfilerActivity.PrivateUse1): Kineto keeps it for its first profile,
// so that a CPU-only profile gets the host's activities too.
PyObject* tpu_register_profiler(PyObject*, PyObject* capsule) {
  auto* a = static_cast<const tpu_prof_api*>(PyCapsule_GetPointer(capsule, TPU_PROF_API_NAME));
  if (!a) return nullptr;
  if (a->version != TPU_PROF_API_VERSION) {
    PyErr_Format(PyExc_ImportError, "torchtpu._device_guard: prof_api version %d, expected %d", a->version,
                 TPU_PROF_API_VERSION);
    return nullptr;
  }
#ifdef TPU_HAVE_KINETO
  if (api) Py_RETURN_TRUE;
  try {
    Py_INCREF(capsule); // kept for the life of the process, as the factory is
    api = a;
    auto& registry = torch::profiler::impl::PrivateUse1ProfilerRegistry::instance();
    registry.registerFactory(
        []() -> std::unique_ptr<libkineto::IActivityProfiler> { return std::make_unique<Profiler>(); });
    registry.onKinetoInit();
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._device_guard: torch refused the tpu's profiler");
    return nullptr;
  }
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}
