#include "core/train/autocast.h"

#include <ATen/autocast_mode.h>

#include "core/train/meta_autocast.h"

namespace memprofd {

AutocastScope::AutocastScope(MixedPrecision precision, c10::DeviceType device_type)
    : active_(precision == MixedPrecision::kBf16), device_type_(device_type) {
  if (!active_) return;
  if (device_type_ == c10::DeviceType::Meta) {
    meta_ = std::make_unique<MetaAutocastScope>(true);
    return;
  }
  // torch.autocast.__enter__: remember the state, set it, count the nesting.
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_ || meta_ != nullptr) return;  // the meta scope restores itself
  // torch.autocast.__exit__: the outermost exit drops the cached casts.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

bool AutocastOn(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::Meta) return MetaAutocastOn();
  return at::autocast::is_autocast_available(device_type) &&
         at::autocast::is_autocast_enabled(device_type);
}

void ClearAutocastWeightCache(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::Meta) {
    ClearMetaAutocastCache();
    return;
  }
  at::autocast::clear_cache();
}

MixedPrecision CurrentMixedPrecision(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::Meta) {
    return MetaAutocastOn() ? MixedPrecision::kBf16 : MixedPrecision::kNo;
  }
  return AutocastOn(device_type) &&
                 at::autocast::get_autocast_dtype(device_type) == at::kBFloat16
             ? MixedPrecision::kBf16
             : MixedPrecision::kNo;
}

}  // namespace memprofd
