#include "server/convert_memory.h"

#include <string>

namespace memprofd {
namespace {

void ToProto(const memory::BreakdownRow& r, memory::BreakdownKey by,
             v1::MemoryBreakdownRow* p) {
  p->set_key(r.key);
  if (by != memory::BreakdownKey::kOp)
    p->set_category(std::string(CategoryName(r.category)));
  p->set_live_bytes(r.live_bytes);
  p->set_peak_bytes(r.peak_bytes);
  if (r.peak_bytes > 0) p->set_peak_phase(std::string(PhaseName(r.peak_phase)));
  p->set_allocated_bytes(r.allocated_bytes);
  p->set_allocated_bytes_total(r.allocated_bytes_total);
  if (by == memory::BreakdownKey::kModule) {
    p->set_module_kind(std::string(ModuleKindName(ModuleKindOf(r.key))));
  }
}

void ToProto(const memory::DiffRow& r, v1::MemoryDiffRow* p) {
  p->set_module(r.module);
  p->set_category(std::string(CategoryName(r.category)));
  p->set_peak_a(r.peak_a);
  p->set_peak_b(r.peak_b);
  p->set_live_a(r.live_a);
  p->set_live_b(r.live_b);
}

}  // namespace

memory::BreakdownRequest FromProto(const v1::GetMemoryBreakdownRequest& request) {
  memory::BreakdownRequest r;
  if (request.has_by()) r.by = request.by();
  if (request.has_phase()) r.phase = request.phase();
  if (request.has_top()) r.top = request.top();
  return r;
}

v1::MemoryBreakdown ToProto(const memory::MemoryBreakdown& b) {
  v1::MemoryBreakdown p;
  p.set_device(b.device);
  p.set_step(b.step);
  p.set_by(std::string(memory::BreakdownKeyName(b.by)));
  if (b.phase) p.set_phase(std::string(PhaseName(*b.phase)));
  for (const memory::BreakdownRow& r : b.rows) ToProto(r, b.by, p.add_rows());
  p.set_total_rows(b.total_rows);
  for (const auto& [category, bytes] : b.categories) {
    v1::CategoryBytes* c = p.add_categories();
    c->set_category(std::string(CategoryName(category)));
    c->set_bytes(bytes);
  }
  p.set_attributed_bytes(b.attributed_bytes);
  p.set_allocator_bytes(b.allocator_bytes);
  for (const memory::BreakdownRow& r : b.ops) {
    ToProto(r, memory::BreakdownKey::kOp, p.add_ops());
  }
  p.set_offloaded_host_bytes(b.offloaded_host_bytes);
  p.set_offloaded_disk_bytes(b.offloaded_disk_bytes);
  return p;
}

v1::MemoryDiff ToProto(const memory::MemoryDiff& d) {
  v1::MemoryDiff p;
  p.set_device(d.device);
  p.set_step_a(d.step_a);
  p.set_step_b(d.step_b);
  for (const memory::DiffRow& r : d.rows) ToProto(r, p.add_rows());
  for (const memory::DiffRow& r : d.categories) ToProto(r, p.add_categories());
  for (int64_t s : d.steps_kept) p.add_steps_kept(s);
  return p;
}

}  // namespace memprofd
