// DynamicCache's public face: length, Crop, Reset, Fork (its inside is dynamic_cache_impl.h).
#include <c10/core/InferenceMode.h>

#include "format/error.h"
#include "reference/dynamic_cache_impl.h"
#include "reference/reference_model.h"

namespace kvdiff::ref {

DynamicCache::DynamicCache() : impl_(std::make_unique<Impl>()) {}
DynamicCache::~DynamicCache() = default;
DynamicCache::DynamicCache(DynamicCache&&) noexcept = default;
DynamicCache& DynamicCache::operator=(DynamicCache&&) noexcept = default;

int64_t DynamicCache::GetSeqLength() const { return impl_->SeqLength(); }

void DynamicCache::Crop(int64_t length) {
  const int64_t current = impl_->SeqLength();
  // transformers accepts a negative length (meaning "drop that many") and ignores a length past
  // the end; both are misuse in a checked API, so they are refused here.
  KVDIFF_CHECK(length >= 0, "DynamicCache::Crop: length must be >= 0, got {}", length);
  KVDIFF_CHECK(length <= current,
               "DynamicCache::Crop: length {} is beyond the cache length {} (Crop only shortens)",
               length, current);
  c10::InferenceMode guard;
  impl_->CropTo(length);
}

void DynamicCache::Reset() {
  impl_->key_cache.clear();
  impl_->value_cache.clear();
}

DynamicCache DynamicCache::Fork() const {
  c10::InferenceMode guard;
  DynamicCache copy;
  for (size_t l = 0; l < impl_->key_cache.size(); ++l) {
    copy.impl_->key_cache.push_back(impl_->key_cache[l].clone());
    copy.impl_->value_cache.push_back(impl_->value_cache[l].clone());
  }
  return copy;
}

}  // namespace kvdiff::ref
